"""Image files in, RGB uint8 arrays out, with the size checked from the header before anything is decoded."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from sdk.errors import InputError

from .image_size import declared_size

# Decoding needs width x height x 3 bytes and more: the size a header declares is checked against this first.
MAX_IMAGE_PIXELS = 64_000_000   # 8000 x 8000; classify --max-pixels / VisionOptions(max_pixels=) change it
MAX_IMAGE_BYTES = 512 << 20     # the encoded file


def read_image(path: str | Path, *, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
    """An image file as RGB uint8 [H, W, 3]; InputError when it is missing, unreadable, declares more than
    `max_pixels` pixels (checked from the header, before decoding), or is not a readable image."""
    import cv2  # here, not at import: commands that read no image never load OpenCV

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
                         fix="downscale it first (e.g. `convert in.png -resize 4000x4000 out.png`), or raise the "
                             "limit (`aie-apps classify --max-pixels`, VisionOptions(max_pixels=...))")
    try:
        image = cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
    except cv2.error as e:  # OpenCV's own pixel limit, or an allocation it could not make
        reason = str(e).strip().splitlines()[-1][:200]
        raise InputError(f"cannot decode {path}: {reason}", fix="pass a smaller or an uncorrupted image") from None
    if image is None:
        raise InputError(f"cannot read {path} as an image (unsupported or corrupt)",
                         fix="pass a JPEG, PNG, BMP, WebP or TIFF file")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
