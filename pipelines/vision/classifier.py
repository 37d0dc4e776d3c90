"""ImageClassifier: top-k labels from a classification head (ViT, DINOv2, ResNet, CLIP's), or CLIP zero-shot."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sdk.errors import UsageError, WeightError
from sdk.models import clip, resnet, vit
from sdk.session import Session
from sdk.vocab import read_tokenizer

from .model import VisionModel, as_batch
from .programs import DEFAULT_CLASSIFIER, VisionOptions, image_graphs, is_zero_shot


@dataclass(frozen=True)
class Prediction:
    label: str
    score: float   # softmax probability
    index: int


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class ImageClassifier(VisionModel):
    """Top-k labels for images: a classification checkpoint (ViT, ResNet) with id2label, or CLIP zero-shot
    over `labels` (prompts built with options.prompt)."""

    def __init__(self, model: str = DEFAULT_CLASSIFIER, *, labels: Sequence[str] | None = None,
                 device: str | None = None, options: VisionOptions = VisionOptions()):
        super().__init__(model, device, options)
        self.zero_shot = is_zero_shot(self.config)
        if self.zero_shot:
            if not labels:
                raise UsageError("CLIP classifies zero-shot and needs labels", fix="pass labels, e.g. --labels cat,dog")
            if isinstance(labels, str):  # list() would make each letter a class
                raise UsageError(f"labels must be a list of class names, got the string {labels!r}",
                                 fix=f"pass a list, e.g. labels={labels.split(',')!r}")
            self._init_clip(list(labels), device)
            return
        if labels:
            raise UsageError(f"labels are for CLIP zero-shot; {self.source.name} has its own classes",
                             fix="drop --labels, or use a CLIP model")
        self.module = resnet if self.model_type == "resnet" else vit if self.model_type in (*vit.VARIANTS, "clip") \
            else None
        self.cfg, weights = self.module.load(self.folder) if self.module else (None, None)
        if not self.module or not self.cfg.num_labels:
            raise UsageError(f"{self.source.name} ({self.model_type}) has no classification head",
                             fix="use a *ForImageClassification checkpoint, a CLIP model with labels, or "
                                 "ImageEmbedder for embeddings")
        id2label = self.config.get("id2label") or {}
        self.labels = [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(self.cfg.num_labels)]
        self.session = Session(image_graphs(self.module, self.cfg, self.batches, self.size), weights, device=device)

    def _init_clip(self, labels: list[str], device: str | None):
        for label in labels:
            if not isinstance(label, str) or not label.strip():
                raise UsageError(f"labels must be non-empty strings, got {label!r}",
                                 fix="pass class names such as 'cat'")
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:  # a repeated class would share its probability between its copies
            raise UsageError(f"repeated labels: {', '.join(repeated)}", fix="list each class once")
        self.cfg, weights = clip.load(self.folder)
        self.labels = labels
        tokenizer_file = self.folder / "tokenizer.json"
        if not tokenizer_file.exists():
            raise WeightError(f"no tokenizer.json in {self.folder}", fix="use a CLIP folder with its tokenizer.json")
        tokenizer = read_tokenizer(tokenizer_file, encodes_any_text=True)
        t = self.cfg.text
        length = t.max_position_embeddings
        ids = np.full((len(labels), length), t.pad_token_id, np.int32)
        mask = np.zeros(ids.shape, np.float32)
        for row, label in enumerate(labels):
            seq = tokenizer.encode(self.options.prompt.format(label)).ids
            seq = ([t.bos_token_id] if not seq or seq[0] != t.bos_token_id else []) + seq
            seq = seq + ([t.eos_token_id] if seq[-1] != t.eos_token_id else [])
            seq = seq[:length - 1] + seq[-1:] if len(seq) > length else seq  # keep end-of-text when truncating
            ids[row, :len(seq)], mask[row, :len(seq)] = seq, 1.0
        n = len(labels)
        graphs = [clip.text_graph(self.cfg, n, length)]
        for b in self.batches:
            graphs += [clip.image_graph(self.cfg, b), clip.similarity_graph(self.cfg, b, n)]
        self.session = Session(graphs, weights, device=device)
        self.text_embeds = self.session.run(clip.text_entry(n, length), ids=ids, mask=mask,
                                            eos=clip.eos_positions(ids, t))["embeds"]

    def infer(self, pixels: np.ndarray) -> np.ndarray:
        """Preprocessed pixels [n, 3, S, S] -> class probabilities [n, classes]."""
        def run(batch, x):
            if self.zero_shot:
                embeds = self.session.run(clip.image_entry(self.cfg, batch), pixels=x)["embeds"]
                return self.session.run(clip.similarity_entry(batch, len(self.labels)), image_embeds=embeds,
                                        text_embeds=self.text_embeds)["logits_per_image"]
            return self.session.run(self.module.entry(batch, self.size), pixels=x)["logits"]
        return _softmax(self._run_batched(pixels, run))

    def top_k(self, probs: np.ndarray, k: int | None = None) -> list[list[Prediction]]:
        if k is not None and (not isinstance(k, (int, np.integer)) or k < 1):  # k=-1 would drop the last class
            raise UsageError(f"k must be a positive integer, got {k!r}", fix="pass k >= 1, or None for options.top_k")
        k = min(k or self.options.top_k, probs.shape[-1])
        order = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
        return [[Prediction(self.labels[i], float(p[i]), int(i)) for i in row if p[i] >= self.options.threshold]
                for row, p in zip(order, probs)]

    def classify(self, images, k: int | None = None):
        """One image (array or path) -> list of Predictions (fewer than k, or none, below options.threshold);
        a list of images -> a list of those lists."""
        batch, single = as_batch(images)
        result = self.top_k(self.infer(self._pixels(batch)), k) if batch else []
        return result[0] if single else result
