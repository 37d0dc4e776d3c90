"""What ImageClassifier and ImageEmbedder share: resolve the model, read its config and preprocessor, hold
one Session, and run it over fixed batch sizes."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from sdk import hub
from sdk.errors import UsageError
from sdk.models import module_for
from sdk.weights import read_config

from .image_file import read_image
from .preprocess import Preprocessor
from .programs import VisionOptions, batch_sizes


def as_batch(images) -> tuple[list, bool]:
    """(list of images, whether one image was given): one is a path or an array ([N, H, W, C] is N images)."""
    single = isinstance(images, (str, Path)) or (isinstance(images, np.ndarray) and images.ndim != 4)
    if not single and not isinstance(images, Iterable):
        raise UsageError(f"expected an image or a list of images, got {type(images).__name__}",
                         fix="pass paths or uint8 [H, W, 3] arrays (np.asarray(pil_image.convert('RGB')) for PIL)")
    return ([images] if single else list(images)), single


class VisionModel:
    """Shared plumbing: resolve the model, read its config and preprocessor, hold one Session."""

    def __init__(self, model: str, device: str | None, options: VisionOptions):
        self.source = hub.resolve(model)
        self.folder = Path(self.source.path)
        self.options = options
        self.config = read_config(self.folder)
        self.model_type = self.config.get("model_type", "")
        module_for(self.model_type)  # an unknown architecture is a UsageError naming the supported ones
        self.preprocess = Preprocessor.from_folder(self.folder)
        self.size = self.preprocess.output_size
        self.batches = batch_sizes(options)
        self._lock = threading.Lock()

    def _pixels(self, images: list) -> np.ndarray:
        return np.stack([self.preprocess(read_image(i, max_pixels=self.options.max_pixels)
                                         if isinstance(i, (str, Path)) else i) for i in images])

    def _run_batched(self, pixels: np.ndarray, run: Callable[[int, np.ndarray], np.ndarray]) -> np.ndarray:
        """Run `run(batch, pixels)` over fixed batch sizes; the last chunk is zero-padded and trimmed. One `run`
        (CLIP zero-shot: image tower and similarity) holds the session alone."""
        outs, big = [], self.batches[-1]
        for start in range(0, len(pixels), big):
            chunk = pixels[start:start + big]
            batch = 1 if len(chunk) == 1 else big
            padded = np.zeros((batch,) + chunk.shape[1:], np.float32)
            padded[:len(chunk)] = chunk
            with self._lock:  # a model may be shared by threads; its session runs one batch at a time
                outs.append(run(batch, padded)[:len(chunk)])
        return np.concatenate(outs)

    def report(self) -> dict:
        return {"model": self.source.name, "model_path": str(self.folder), **self.session.report()}

    def close(self):
        self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
