"""ImageEmbedder: one vector per image (DINOv2, CLIP, ViT)."""
from __future__ import annotations

import numpy as np

from sdk.errors import UsageError
from sdk.models import clip, vit
from sdk.session import Session

from .model import VisionModel, as_batch
from .programs import DEFAULT_EMBEDDER, VisionOptions, image_graphs


class ImageEmbedder(VisionModel):
    """Image embeddings: DINOv2 (the [CLS] token after the final norm), CLIP (projected image embeddings),
    ViT (the [CLS] token). L2-normalised unless options say otherwise."""

    def __init__(self, model: str = DEFAULT_EMBEDDER, *, device: str | None = None,
                 options: VisionOptions = VisionOptions(), normalize: bool = True):
        super().__init__(model, device, options)
        self.normalize = normalize
        if self.model_type == "clip":
            self.cfg, weights = clip.load(self.folder)
            graphs, self.output = [clip.image_graph(self.cfg, b) for b in self.batches], "embeds"
            self.entry = lambda b: clip.image_entry(self.cfg, b)
        elif self.model_type in vit.VARIANTS:
            self.cfg, weights = vit.load(self.folder)
            graphs, self.output = image_graphs(vit, self.cfg, self.batches, self.size), "pooled"
            self.entry = lambda b: vit.entry(b, self.size)
        else:
            raise UsageError(f"{self.model_type} is not an image embedding model", fix="use DINOv2, CLIP or ViT")
        self.session = Session(graphs, weights, device=device)
        self.dim = self.cfg.projection_dim if self.model_type == "clip" else self.cfg.hidden_size

    def embed(self, images) -> np.ndarray:
        """One image -> [dim]; a list -> [n, dim]."""
        batch, single = as_batch(images)
        if not batch:
            return np.zeros((0, self.dim), np.float32)
        out = self._run_batched(self._pixels(batch), lambda b, x: self.session.run(
            self.entry(b), pixels=x)[self.output])
        if self.normalize:
            out = out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
        return out[0] if single else out
