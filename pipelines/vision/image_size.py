"""The pixel size an image file declares in its header, read before decoding: a 1 MB PNG can declare
100000 x 100000 pixels, and the decoder would try to allocate them (30 GB) before it finds out.

Covers PNG, JPEG, GIF, BMP, WebP and PNM; None for anything else (the decoder's own limit then applies).
"""
from __future__ import annotations

import struct


def declared_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the header of an encoded image, or None when the format is not one of those above
    or the header is cut off before the size."""
    try:
        if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
            return struct.unpack(">II", data[16:24])
        if data[:6] in (b"GIF87a", b"GIF89a"):
            return struct.unpack("<HH", data[6:10])
        if data[:2] == b"BM":
            width, height = struct.unpack("<ii", data[18:26])
            return abs(width), abs(height)  # a negative height means top-down rows
        if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            return _webp(data)
        if data[:2] == b"\xff\xd8":
            return _jpeg(data)
        if data[:1] == b"P" and data[1:2] in b"123456":
            return _pnm(data)
    except (struct.error, ValueError):  # cut off inside the header, or not numbers where the size goes
        return None
    return None


def _webp(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X":  # 24-bit (width - 1), (height - 1)
        w, h = data[24:27], data[27:30]
        return int.from_bytes(w, "little") + 1, int.from_bytes(h, "little") + 1
    if chunk == b"VP8L":  # 14 bits each after the 0x2f signature
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 ":
        w, h = struct.unpack("<HH", data[26:30])
        return w & 0x3FFF, h & 0x3FFF
    return None


_JPEG_FRAMES = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg(data: bytes) -> tuple[int, int] | None:
    """The size in the first start-of-frame marker, walking the marker segments."""
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            pos += 2
            continue
        (length,) = struct.unpack(">H", data[pos + 2:pos + 4])
        if marker in _JPEG_FRAMES:
            height, width = struct.unpack(">HH", data[pos + 5:pos + 9])
            return width, height
        pos += 2 + length
    return None


def _pnm(data: bytes) -> tuple[int, int] | None:
    words = []
    for line in data[2:4096].split(b"\n"):
        words += line.split(b"#")[0].split()
        if len(words) >= 2:
            return int(words[0]), int(words[1])
    return None
