"""What a vision model folder runs: the options, the batch sizes and the graphs of its one session, which is
also what `aie-apps build` compiles for it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sdk.errors import UsageError
from sdk.models import clip, module_for, vit
from sdk.weights import read_config

from .image_file import MAX_IMAGE_PIXELS
from .preprocess import Preprocessor

DEFAULT_CLASSIFIER = "google/vit-base-patch16-224"
DEFAULT_EMBEDDER = "facebook/dinov2-small"


@dataclass(frozen=True)
class VisionOptions:
    top_k: int = 5
    batch_size: int = 4                 # images per batched run; 1-image runs have their own graph
    prompt: str = "a photo of a {}."    # CLIP zero-shot: each label is put into this template
    threshold: float = 0.0              # top-k keeps only labels scoring at least this (0..1)
    max_pixels: int = MAX_IMAGE_PIXELS  # image files declaring more (checked from the header) are refused

    def __post_init__(self):
        if self.top_k < 1 or self.batch_size < 1:
            raise UsageError(f"top_k ({self.top_k}) and batch_size ({self.batch_size}) must be at least 1",
                             fix="pass positive values")
        if not isinstance(self.max_pixels, int) or self.max_pixels < 1:
            raise UsageError(f"max_pixels must be a positive integer, got {self.max_pixels!r}",
                             fix=f"e.g. max_pixels={MAX_IMAGE_PIXELS} (the default)")
        if not 0.0 <= self.threshold <= 1.0:  # scores are probabilities: outside [0, 1] it keeps all or none
            raise UsageError(f"threshold must be between 0 and 1, got {self.threshold}",
                             fix="pass a probability such as 0.1")
        try:  # without a working {} every label would get the same prompt, and the same score
            distinct = self.prompt.format("a") != self.prompt.format("b")
        except (IndexError, KeyError, ValueError):
            distinct = False
        if not distinct:
            raise UsageError(f"the prompt {self.prompt!r} needs one {{}} where the label goes",
                             fix="e.g. prompt='a photo of a {}.'")


# One image per run: how `aie-apps classify` goes through frames (cameras, videos, images), so its program holds
# batch 1 only, and what `aie-apps build` builds for a classification model.
FRAME_OPTIONS = VisionOptions(batch_size=1)


def batch_sizes(options: VisionOptions) -> list[int]:
    """One image runs at batch 1; more in batches of options.batch_size (the last one padded)."""
    return sorted({1, options.batch_size})


def image_graphs(module, cfg, batches: list[int], size: int) -> list:
    """A vit / resnet tower at each batch size: the session of ImageClassifier, and of ImageEmbedder (vit)."""
    return [module.graph(cfg, b, size) for b in batches]


def program_graphs(folder: Path, options: VisionOptions) -> list:
    """The graphs ImageClassifier (vit, resnet) or ImageEmbedder (CLIP: its image tower) runs for this model folder
    with these options: what `aie-apps build` compiles. CLIP's zero-shot classifier adds text graphs sized by the
    labels given at run time, which no build can know."""
    config = read_config(folder)
    batches = batch_sizes(options)
    if is_zero_shot(config):
        return [clip.image_graph(clip.load(folder)[0], b) for b in batches]
    module = vit if config.get("model_type") == "clip" else module_for(config.get("model_type", ""))
    return image_graphs(module, module.load(folder)[0], batches, Preprocessor.from_folder(folder).output_size)


def is_zero_shot(config: dict) -> bool:
    """A whole CLIP model (both towers) classifies zero-shot; CLIPForImageClassification has a trained head."""
    return config.get("model_type") == "clip" and "CLIPForImageClassification" not in (config.get("architectures") or ())
