"""What a checkpoint's preprocessor_config.json asks for, done as transformers' PIL image processors do it
(resize with PIL's resampling filters, centre crop, rescale, normalise), in numpy."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sdk.errors import InputError, UsageError, WeightError
from sdk.weights import read_json_object

from .resize import resize

MAX_ASPECT = 100  # long side : short side of the images a shortest-edge resize takes


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
