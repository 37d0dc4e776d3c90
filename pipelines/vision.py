"""Images in, labels or embeddings out: preprocessing, ImageClassifier, ImageEmbedder, and frame sources.

    from sdk import ImageClassifier
    with ImageClassifier("google/vit-base-patch16-224") as clf:
        print(clf.classify("cat.jpg"))                        # [Prediction(label, score, index), ...]
    with ImageClassifier("openai/clip-vit-base-patch32", labels=["cat", "dog"]) as clf:  # zero-shot
        ...

Preprocessing follows the checkpoint's preprocessor_config.json exactly as transformers' PIL image
processors do it (resize with PIL's resampling filters, centre crop, rescale, normalise), in numpy.
Sources turn camera indices, /dev/videoN, video files, images, folders and video URLs into frames; a camera
(or a live stream) is read by a grabber thread that keeps only the newest frame, so results never lag reality.
"""
from __future__ import annotations

import functools
import math
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from sdk import hub
from sdk.errors import DeviceIOError, InputError, UsageError, WeightError
from sdk.models import clip, module_for, resnet, vit
from sdk.session import Session
from sdk.vocab import read_tokenizer
from sdk.weights import read_config, read_json_object

DEFAULT_CLASSIFIER = "google/vit-base-patch16-224"
DEFAULT_EMBEDDER = "facebook/dinov2-small"
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
VIDEO_SUFFIXES = {".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv", ".gif"}


# ---- preprocessing ------------------------------------------------------------------------------------

def _triangle(t):
    return np.maximum(1.0 - np.abs(t), 0.0)


def _bicubic(t, a=-0.5):  # PIL's cubic kernel uses a = -0.5
    t = np.abs(t)
    return np.where(t < 1, ((a + 2) * t - (a + 3)) * t * t + 1, np.where(t < 2, (((t - 5) * t + 8) * t - 4) * a, 0.0))


def _lanczos(t):
    return np.where(np.abs(t) < 3, np.sinc(t) * np.sinc(t / 3), 0.0)


def _box(t):
    return ((t > -0.5) & (t <= 0.5)).astype(np.float64)


# PIL resample codes (Image.Resampling): filter and support
_FILTERS = {1: (_lanczos, 3.0), 2: (_triangle, 1.0), 3: (_bicubic, 2.0), 4: (_box, 0.5)}
_PRECISION_BITS = 22  # PIL's fixed point for 8-bit images: 32 - 8 - 2


@functools.lru_cache(maxsize=64)
def _pil_taps(n_in: int, n_out: int, resample: int) -> tuple[np.ndarray, np.ndarray]:
    """PIL's separable resize (ImagingResample) for one axis: per output pixel, the input indices [n_out, K]
    and integer weights [n_out, K] in PIL's fixed point (unused taps have weight 0)."""
    scale = n_in / n_out
    if resample == 0:  # nearest
        idx = np.minimum(((np.arange(n_out) + 0.5) * scale).astype(np.int64), n_in - 1)[:, None]
        return idx, np.full((n_out, 1), 1 << _PRECISION_BITS, np.int32)
    if resample not in _FILTERS:
        raise UsageError(f"unsupported resample filter {resample}", fix="use 0 nearest, 1 lanczos, 2 bilinear, "
                                                                        "3 bicubic or 4 box")
    kernel, support = _FILTERS[resample]
    fscale = max(scale, 1.0)
    support *= fscale
    taps = int(math.ceil(support)) * 2 + 1
    idx, weights = np.zeros((n_out, taps), np.int64), np.zeros((n_out, taps), np.int32)
    for i in range(n_out):
        center = (i + 0.5) * scale
        lo, hi = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), n_in)
        w = kernel((np.arange(lo, hi) - center + 0.5) / fscale)
        w = w / w.sum() if w.sum() else w
        idx[i, :hi - lo] = np.arange(lo, hi)
        weights[i, :hi - lo] = np.where(w < 0, np.trunc(-0.5 + w * (1 << _PRECISION_BITS)),
                                        np.trunc(0.5 + w * (1 << _PRECISION_BITS)))
    return idx, weights


def _resample_axis(image: np.ndarray, n_out: int, resample: int, axis: int) -> np.ndarray:
    """One PIL pass over uint8 data: exact integer sums (they fit in int32), PIL's rounding, clipped to uint8."""
    x = np.ascontiguousarray(np.moveaxis(image, axis, 0)).astype(np.int32)
    idx, weights = _pil_taps(x.shape[0], n_out, resample)
    acc = np.full((n_out,) + x.shape[1:], 1 << (_PRECISION_BITS - 1), np.int32)
    for k in range(idx.shape[1]):
        acc += weights[:, k].reshape((-1,) + (1,) * (x.ndim - 1)) * x[idx[:, k]]
    return np.moveaxis(np.clip(acc >> _PRECISION_BITS, 0, 255).astype(np.uint8), 0, axis)


def resize(image: np.ndarray, height: int, width: int, resample: int) -> np.ndarray:
    """Resize an RGB uint8 image [H, W, 3] like PIL's Image.resize (horizontal pass, then vertical)."""
    h, w = image.shape[:2]
    if w != width:
        image = _resample_axis(image, width, resample, axis=1)
    if h != height:
        image = _resample_axis(image, height, resample, axis=0)
    return image


def _square(v) -> dict:
    return {"height": v, "width": v} if isinstance(v, int) else dict(v)


@dataclass(frozen=True)
class Preprocessor:
    """What a checkpoint's preprocessor_config.json asks for, normalised to one rule set:
    resize (to height x width, or shortest edge), optional centre crop, rescale, normalise."""
    resize_to: tuple[int, int] | None      # (height, width)
    shortest_edge: int | None
    crop: tuple[int, int] | None
    resample: int
    rescale: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def from_config(cls, c: dict) -> "Preprocessor":
        kind = (c.get("image_processor_type") or c.get("feature_extractor_type") or "")
        for suffix in ("Pil", "Fast"):
            kind = kind.removesuffix(suffix)
        kind = kind.removesuffix("ImageProcessor").removesuffix("FeatureExtractor")
        shortest_first = kind in ("CLIP", "Bit", "ConvNext")  # how an int `size` is read, as transformers does
        size = c.get("size", 224)
        size = ({"shortest_edge": size} if shortest_first else _square(size)) if isinstance(size, int) else size
        crop = _square(c.get("crop_size", 224)) if c.get("do_center_crop", kind in ("CLIP", "Bit")) else None
        resize_to = (size["height"], size["width"]) if "height" in size else None
        shortest = size.get("shortest_edge")
        if kind == "ConvNext":  # resize the short side to size / crop_pct, crop the centre (size >= 384: square)
            edge = size["shortest_edge"]
            if edge < 384:
                shortest, crop = int(edge / c.get("crop_pct", 224 / 256)), {"height": edge, "width": edge}
            else:
                shortest, resize_to = None, (edge, edge)
        if not c.get("do_resize", True):
            resize_to = shortest = None
        mean = tuple(c.get("image_mean", (0.5, 0.5, 0.5))) if c.get("do_normalize", True) else (0.0, 0.0, 0.0)
        std = tuple(c.get("image_std", (0.5, 0.5, 0.5))) if c.get("do_normalize", True) else (1.0, 1.0, 1.0)
        default_resample = 2 if kind in ("ViT", "") else 3
        return cls(resize_to, shortest, (crop["height"], crop["width"]) if crop else None,
                   int(c.get("resample", default_resample)),
                   float(c.get("rescale_factor", 1 / 255)) if c.get("do_rescale", True) else 1.0, mean, std)

    @classmethod
    def from_folder(cls, folder: str | Path) -> "Preprocessor":
        path = Path(folder) / "preprocessor_config.json"
        if not path.exists():
            raise WeightError(f"no preprocessor_config.json in {folder}",
                              fix="use a model folder saved with its image processor")
        return cls.from_config(read_json_object(path, "preprocessor_config.json"))

    @property
    def output_size(self) -> int:
        h, w = self.crop or self.resize_to or (0, 0)
        if h != w or not h:
            raise UsageError(f"the preprocessor gives {h}x{w} images; the vision models need a fixed square size")
        return h

    def resized(self, image: np.ndarray) -> np.ndarray:
        """Resize and crop, still uint8 [H, W, 3] (what a screenshot of the model's input would show)."""
        if self.resize_to:
            image = resize(image, *self.resize_to, self.resample)
        elif self.shortest_edge:
            h, w = image.shape[:2]
            short, long = (w, h) if w <= h else (h, w)
            if long > MAX_ASPECT * short:  # its shortest edge scaled up, the long one would need gigabytes
                raise InputError(f"the image is {w}x{h} pixels: too elongated to scale its short side to "
                                 f"{self.shortest_edge}", fix=f"crop it to the part to classify (at most "
                                                              f"{MAX_ASPECT}:1)")
            new_short, new_long = self.shortest_edge, int(self.shortest_edge * long / short)
            image = resize(image, *((new_long, new_short) if w <= h else (new_short, new_long)), self.resample)
        if self.crop:
            image = center_crop(image, *self.crop)
        return image

    def __call__(self, image: np.ndarray) -> np.ndarray:
        """RGB uint8 [H, W, 3] -> float32 [3, S, S], normalised."""
        x = self.resized(_as_rgb(image)).astype(np.float32) * np.float32(self.rescale)
        x = (x - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        return np.ascontiguousarray(x.transpose(2, 0, 1))


MAX_ASPECT = 100  # long side : short side of the images a shortest-edge resize takes


def center_crop(image: np.ndarray, height: int, width: int) -> np.ndarray:
    h, w = image.shape[:2]
    if h < height or w < width:  # as transformers: pad with zeros around the image first
        top, left = max(math.ceil((height - h) / 2), 0), max(math.ceil((width - w) / 2), 0)
        padded = np.zeros((max(h, height), max(w, width), image.shape[2]), image.dtype)
        padded[top:top + h, left:left + w] = image
        image, h, w = padded, padded.shape[0], padded.shape[1]
    top, left = (h - height) // 2, (w - width) // 2
    return image[top:top + height, left:left + width]


def _as_rgb(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise InputError(f"images must be uint8 RGB arrays, got {image.dtype}",
                         fix="convert with (x * 255).clip(0, 255).astype(np.uint8)")
    if image.ndim == 2:
        return np.repeat(image[:, :, None], 3, axis=2)
    if image.ndim != 3 or image.shape[2] not in (3, 4) or 0 in image.shape:
        raise InputError(f"images must be [H, W, 3] RGB arrays, got shape {image.shape}",
                         fix="pass [H, W, 3] RGB, [H, W, 4] RGBA or [H, W] gray; [3, H, W] becomes "
                             "x.transpose(1, 2, 0)")
    return image[:, :, :3]


# Decoding needs width x height x 3 bytes and more: the size a header declares is checked against this first.
MAX_IMAGE_PIXELS = 64_000_000   # 8000 x 8000; read_image(max_pixels=...) raises it
MAX_IMAGE_BYTES = 512 << 20     # the encoded file


def read_image(path: str | Path, *, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
    """An image file as RGB uint8 [H, W, 3]; InputError when it is missing, unreadable, declares more than
    `max_pixels` pixels (checked from the header, before decoding), or is not a readable image."""
    import cv2

    from .image_size import declared_size
    path = Path(path)
    if not path.exists():
        raise InputError(f"no such image file: {path}", fix="check the path")
    if not path.is_file():
        raise InputError(f"{path} is not a regular file (a folder, device or FIFO)", fix="pass an image file")
    try:
        if path.stat().st_size > MAX_IMAGE_BYTES:
            raise InputError(f"{path} is {path.stat().st_size:,} bytes, more than an image file read here can be "
                             f"({MAX_IMAGE_BYTES:,})", fix="downscale it first (e.g. `convert in.png -resize 4000x4000 out.png`)")
        data = np.fromfile(path, np.uint8)
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}", fix=f"check the permissions of {path}") from None
    size = declared_size(data[:1 << 20].tobytes())
    if size is not None and size[0] * size[1] > max_pixels:
        raise InputError(f"{path} declares {size[0]} x {size[1]} pixels, more than the limit of {max_pixels:,}",
                         fix="downscale it first (e.g. `convert in.png -resize 4000x4000 out.png`), or pass a larger "
                             "max_pixels")
    try:
        image = cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
    except cv2.error as e:  # OpenCV's own pixel limit, or an allocation it could not make
        reason = str(e).strip().splitlines()[-1][:200]
        raise InputError(f"cannot decode {path}: {reason}", fix="pass a smaller or an uncorrupted image") from None
    if image is None:
        raise InputError(f"cannot read {path} as an image (unsupported or corrupt)",
                         fix="pass a JPEG, PNG, BMP, WebP or TIFF file")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


# ---- models -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VisionOptions:
    top_k: int = 5
    batch_size: int = 4                 # images per batched run; 1-image runs have their own graph
    prompt: str = "a photo of a {}."    # CLIP zero-shot: each label is put into this template
    threshold: float = 0.0              # top-k keeps only labels scoring at least this (0..1)

    def __post_init__(self):
        if self.top_k < 1 or self.batch_size < 1:
            raise UsageError(f"top_k ({self.top_k}) and batch_size ({self.batch_size}) must be at least 1",
                             fix="pass positive values")
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


@dataclass(frozen=True)
class Prediction:
    label: str
    score: float   # softmax probability
    index: int


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _batch(images) -> tuple[list, bool]:
    """(list of images, whether one image was given): one is a path or an array ([N, H, W, C] is N images)."""
    single = isinstance(images, (str, Path)) or (isinstance(images, np.ndarray) and images.ndim != 4)
    if not single and not isinstance(images, Iterable):
        raise UsageError(f"expected an image or a list of images, got {type(images).__name__}",
                         fix="pass paths or uint8 [H, W, 3] arrays (np.asarray(pil_image.convert('RGB')) for PIL)")
    return ([images] if single else list(images)), single


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


class _VisionModel:
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

    def _pixels(self, images: list) -> np.ndarray:
        return np.stack([self.preprocess(read_image(i) if isinstance(i, (str, Path)) else i) for i in images])

    def _run_batched(self, pixels: np.ndarray, run: Callable[[int, np.ndarray], np.ndarray]) -> np.ndarray:
        """Run `run(batch, pixels)` over fixed batch sizes; the last chunk is zero-padded and trimmed."""
        outs, big = [], self.batches[-1]
        for start in range(0, len(pixels), big):
            chunk = pixels[start:start + big]
            batch = 1 if len(chunk) == 1 else big
            padded = np.zeros((batch,) + chunk.shape[1:], np.float32)
            padded[:len(chunk)] = chunk
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


class ImageClassifier(_VisionModel):
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
        batch, single = _batch(images)
        result = self.top_k(self.infer(self._pixels(batch)), k) if batch else []
        return result[0] if single else result


class ImageEmbedder(_VisionModel):
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
        batch, single = _batch(images)
        if not batch:
            return np.zeros((0, self.dim), np.float32)
        out = self._run_batched(self._pixels(batch), lambda b, x: self.session.run(
            self.entry(b), pixels=x)[self.output])
        if self.normalize:
            out = out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
        return out[0] if single else out


# ---- frame sources -----------------------------------------------------------------------------------

@dataclass
class Frame:
    index: int          # position in its source (0-based)
    time: float         # seconds: stream timestamp for video, since opening for a camera, 0 for images
    image: np.ndarray   # RGB uint8 [H, W, 3]
    source: str         # path, or camera:N
    capture_ms: float   # time spent reading/decoding (or waiting for) this frame


class ImageFiles:
    """Image files (a folder expands to its images, sorted by name). An unreadable file raises InputError
    when reached, or, given `on_error`, is reported there and skipped."""
    kind = "images"

    def __init__(self, paths: Sequence[Path], on_error: Callable[[InputError], None] | None = None):
        self.paths, self.on_error = list(paths), on_error
        self.name = str(self.paths[0]) if len(self.paths) == 1 else f"{len(self.paths)} images"

    def __iter__(self) -> Iterator[Frame]:
        for index, path in enumerate(self.paths):
            t0 = time.perf_counter()
            try:
                image = read_image(path)
            except InputError as e:
                if self.on_error is None:
                    raise
                self.on_error(e)
                continue
            yield Frame(index, 0.0, image, str(path), (time.perf_counter() - t0) * 1e3)

    def close(self):
        pass


class VideoFile:
    """Frames of a video file in order; ends cleanly at the end of the stream. A few unreadable frames in a
    row are skipped (counted in `skipped`); more than `max_bad` in a row ends the video early. `capture` is
    an already opened one (a video file on a server)."""
    kind = "video"

    def __init__(self, path: Path | str, max_bad: int = 5, capture=None):
        import cv2
        self.max_bad, self.skipped = max_bad, 0
        self.name = str(path)
        if capture is None:
            if not Path(path).is_file():
                raise InputError(f"no such video file: {path}", fix="check the path")
            capture = cv2.VideoCapture(str(path))
            if not capture.isOpened():
                raise InputError(f"cannot open {path} as a video (unsupported or corrupt)",
                                 fix="pass a video OpenCV's FFmpeg can decode (mp4, avi, mkv, webm)")
        self.cap = capture
        self.fps = self.cap.get(cv2.CAP_PROP_FPS) or 0.0
        self.frame_count = int(self.cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)

    def __iter__(self) -> Iterator[Frame]:
        import cv2
        index, bad = 0, 0
        while True:
            t0 = time.perf_counter()
            ok, image = self.cap.read()
            if not ok or image is None:  # the end, or a frame the decoder could not read (already consumed)
                if self.frame_count and index + self.skipped + bad >= self.frame_count or bad + 1 >= self.max_bad:
                    if self.frame_count > index + self.skipped:  # the file promised frames it did not deliver
                        self.skipped += min(bad + 1, self.frame_count - index - self.skipped)
                    return
                bad += 1
                continue
            self.skipped, bad = self.skipped + bad, 0
            seconds = self.cap.get(cv2.CAP_PROP_POS_MSEC) / 1e3
            yield Frame(index, seconds, cv2.cvtColor(image, cv2.COLOR_BGR2RGB), self.name,
                        (time.perf_counter() - t0) * 1e3)
            index += 1

    def close(self):
        self.cap.release()


class Camera:
    """A live camera (or live stream URL): a grabber thread reads continuously and keeps only the newest frame,
    so a slow model sees the present, not a queue of old frames. MJPG is requested (720p30 on many webcams
    needs it) and the driver buffer is set to 1. Missing, busy or silent cameras raise DeviceIOError; nothing
    blocks for longer than the timeouts."""
    kind = "camera"

    def __init__(self, device: int | str, *, width: int = 0, height: int = 0, first_frame_timeout: float = 5.0,
                 frame_timeout: float = 2.0, open_capture: Callable | None = None):
        import cv2
        self.device = device
        self.stream = isinstance(device, str) and _is_url(device)  # a live stream's faults are not a camera's
        self.name = device if self.stream else f"camera:{device}"
        path = Path(f"/dev/video{device}") if isinstance(device, int) else Path(device)
        if open_capture is None:
            _check_camera_node(path)
            open_capture = cv2.VideoCapture
        self.cap = open_capture(device if isinstance(device, int) else str(device))
        if not self.cap.isOpened():
            raise DeviceIOError(f"cannot open {self.name} ({path}): it is busy or not a capture device",
                                fix="close other programs using the camera (lsof " + str(path) + "), check "
                                    "permissions (the video group), or pick another with --list-cameras")
        self.cap.set(cv2.CAP_PROP_FOURCC, cv2.VideoWriter_fourcc(*"MJPG"))
        self.cap.set(cv2.CAP_PROP_BUFFERSIZE, 1)
        if width and height:
            self.cap.set(cv2.CAP_PROP_FRAME_WIDTH, width)
            self.cap.set(cv2.CAP_PROP_FRAME_HEIGHT, height)
        self.first_frame_timeout, self.frame_timeout = first_frame_timeout, frame_timeout
        self.dropped = 0          # frames the grabber replaced before anyone took them
        self._latest = None       # (sequence number, seconds, BGR image)
        self._error: str | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._opened = time.perf_counter()
        self._thread = threading.Thread(target=self._grab, name=f"grabber-{device}", daemon=True)
        self._thread.start()

    def _grab(self):
        seq, failures = 0, 0
        while not self._stop.is_set():
            ok, image = self.cap.read()
            with self._cond:
                if ok and image is not None:
                    failures = 0
                    if self._latest is not None and self._latest[0] == seq:
                        self.dropped += 1
                    seq += 1
                    self._latest = (seq, time.perf_counter() - self._opened, image)
                    self._cond.notify_all()
                else:
                    failures += 1
                    if failures >= 30:  # about a second of failed reads at 30 fps: the camera went away
                        self._error = (f"{self.name} stopped delivering frames (unplugged, taken by another "
                                       "program, or the stream ended)")
                        self._cond.notify_all()
                        return
            if not ok:
                time.sleep(0.03)

    def __iter__(self) -> Iterator[Frame]:
        import cv2
        taken, index = 0, 0
        while not self._stop.is_set():
            t0 = time.perf_counter()
            timeout = self.first_frame_timeout if index == 0 else self.frame_timeout
            with self._cond:
                ready = self._cond.wait_for(lambda: self._error or (self._latest and self._latest[0] > taken),
                                            timeout=timeout)
                # a stream that ends is a source that ended (skipped like an unreadable file), not a device fault
                fault = InputError if self.stream else DeviceIOError
                if self._error:
                    raise fault(self._error, fix="check that the stream is still up, and run again"
                                if self.stream else "reconnect the camera and run again")
                if not ready:
                    raise fault(f"{self.name} delivered no frame within {timeout:g} s (busy or stalled)",
                                fix="check the stream in a video player" if self.stream
                                else "close other programs using the camera, or pick another one")
                taken, seconds, image = self._latest
            yield Frame(index, seconds, cv2.cvtColor(image, cv2.COLOR_BGR2RGB), self.name,
                        (time.perf_counter() - t0) * 1e3)
            index += 1

    def close(self):
        self._stop.set()
        self._thread.join(timeout=2.0)
        if not self._thread.is_alive():  # never release under a read that is still blocked
            self.cap.release()


def _camera_fix() -> str:
    found = [c["path"] for c in list_cameras(probe=False)]
    return (f"cameras present: {', '.join(found)}" if found else "no /dev/video* devices: connect a camera "
            "(and check `dmesg` for the uvcvideo driver)") + "; see `aie-apps classify --list-cameras`"


def list_cameras(probe: bool = True) -> list[dict]:
    """Video4Linux capture nodes: index, path, driver name, and (probe=True) whether a frame can be read."""
    cameras = []
    for path in sorted(Path("/dev").glob("video*"), key=lambda p: int(p.name[5:]) if p.name[5:].isdigit() else 0):
        if not path.name[5:].isdigit():
            continue
        name_file = Path("/sys/class/video4linux") / path.name / "name"
        entry = {"index": int(path.name[5:]), "path": str(path),
                 "name": name_file.read_text().strip() if name_file.exists() else ""}
        if probe:
            import cv2
            cap = cv2.VideoCapture(entry["index"])
            entry["usable"] = bool(cap.isOpened() and cap.read()[0])
            if entry["usable"]:
                entry["size"] = [int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))]
            cap.release()
        cameras.append(entry)
    return cameras


def check_source(spec: str) -> None:
    """Raise the InputError open_source would for a missing file or a folder without images (cheap, and opens
    nothing: an app can check all its sources before it loads a model). A camera's device node must exist
    (DeviceIOError); whether it opens, and URLs, are found when opened."""
    if is_camera(spec):
        _check_camera_node(Path(f"/dev/video{spec}") if spec.isdigit() else Path(spec))
        return
    if _is_url(spec):
        return
    path = Path(spec).expanduser()
    if path.is_dir():
        _folder_images(path)
    elif not path.exists():
        raise InputError(f"no such file or folder: {spec}", fix="check the path, or pass a camera index")


def _check_camera_node(path: Path) -> None:
    if not path.exists():
        raise DeviceIOError(f"no camera at {path}", fix=_camera_fix())


def is_camera(spec: str) -> bool:
    """A SOURCE that names a camera: an index or /dev/videoN."""
    return spec.isdigit() or spec.startswith("/dev/video")


def _is_url(spec: str) -> bool:
    return re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", spec) is not None


STREAM_TIMEOUT_MS = 10_000  # opening a URL, and each read from it: an unresponsive server cannot hang the run


def _open_url(url: str):
    """A video file on a server plays in order (VideoFile); a live stream, which has no frame count, is read
    like a camera, newest frame only."""
    import cv2
    cap = cv2.VideoCapture(url, cv2.CAP_FFMPEG, [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, STREAM_TIMEOUT_MS,
                                                 cv2.CAP_PROP_READ_TIMEOUT_MSEC, STREAM_TIMEOUT_MS])
    if not cap.isOpened():
        raise InputError(f"cannot open {url} (unreachable, or not a video or stream FFmpeg can read)",
                         fix="check the address, and that the server is up and the stream plays in a video player")
    if cap.get(cv2.CAP_PROP_FRAME_COUNT) > 0:
        return VideoFile(url, capture=cap)
    return Camera(url, open_capture=lambda _: cap)


def _folder_images(path: Path) -> list[Path]:
    images = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise InputError(f"no images in folder {path}", fix=f"add {', '.join(sorted(IMAGE_SUFFIXES))} files")
    return images


def open_source(spec: str, on_error: Callable[[InputError], None] | None = None):
    """A SOURCE argument -> ImageFiles, VideoFile or Camera: a camera index or /dev/videoN, a video file,
    an image file, a folder of images, or a URL (http, rtsp, ...: a video file on a server, or a live stream)."""
    if is_camera(spec):
        return Camera(int(spec) if spec.isdigit() else spec)
    if _is_url(spec):
        return _open_url(spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        return ImageFiles(_folder_images(path), on_error)
    check_source(spec)
    if path.suffix.lower() in VIDEO_SUFFIXES:
        return VideoFile(path)
    return ImageFiles([path], on_error)
