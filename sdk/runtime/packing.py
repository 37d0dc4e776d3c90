"""Packing: a program's weights arena built from the checkpoint's float32 weights, once per load.

Each WEIGHTS buffer has a recipe in the program (meta["layout"], written by sdk/compiler/layout.py): "plain"
(stored as it is, in its stored dtype), "gemm_b" (a GEMM's B: [K, N], merged projections concatenated along
N, zero-padded to whole tiles and stored tile-major [Kp/tk, Np/tn, tk, tn] in bf16, round to nearest even;
split weights as two planes hi = bf16(w), lo = bf16(w - hi)) or "bias" (concatenated, padded, fp32).
Packed buffers are cached in-process by the content hash of their recipe and source bytes, so sessions that
share weights pack them once.
"""
from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Mapping

import ml_dtypes
import numpy as np

from ..errors import WeightError
from ..program import Program, Usage, apply_views

BF16 = np.dtype(ml_dtypes.bfloat16)
_CACHE: "OrderedDict[str, np.ndarray]" = OrderedDict()
_CACHE_BYTES = 1 << 30


def pack(recipe: dict, sources: Mapping[str, np.ndarray]) -> np.ndarray:
    """The stored form of one weights-arena buffer, from its recipe and the float32 source weights."""
    h = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
    for s in recipe["sources"]:
        if s is not None:
            a = np.ascontiguousarray(sources[s[0]])
            h.update(str((a.shape, a.dtype.str)).encode())
            h.update(memoryview(a).cast("B"))
    key = h.hexdigest()
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    packed = _PACKERS[recipe["kind"]](recipe, sources)
    _CACHE[key] = packed
    while sum(a.nbytes for a in _CACHE.values()) > _CACHE_BYTES and len(_CACHE) > 1:
        _CACHE.popitem(last=False)
    return packed


def _plain(recipe, sources):
    return np.asarray(sources[recipe["sources"][0][0]]).astype(recipe["dtype"])


def _gemm_b(recipe, sources):
    """[K, N] concatenated along N, padded, tile-major [Kp/tk, Np/tn, tk, tn], bf16 (round to nearest even)."""
    mats = []
    for name, views in recipe["sources"]:
        m = apply_views(np.asarray(sources[name], np.float32), views)
        mats.append(m.T if recipe["transpose_b"] else m)
    b = np.concatenate(mats, axis=1)
    tk, tn = recipe["tk"], recipe["tn"]
    K, N = b.shape
    Kp, Np = -(-K // tk) * tk, -(-N // tn) * tn
    b = np.pad(b, ((0, Kp - K), (0, Np - N)))
    hi = np.ascontiguousarray(tile_major(b, tk, tn)).astype(BF16)
    if recipe.get("planes", 1) == 1:
        return hi
    lo = (tile_major(b, tk, tn) - hi.astype(np.float32)).astype(BF16)  # what rounding to bf16 left out
    return np.stack([hi, lo])


def tile_major(b: np.ndarray, tk: int, tn: int) -> np.ndarray:
    """[Kp, Np] -> [Kp/tk, Np/tn, tk, tn]: the order the GEMM kernel's DMA streams B tiles in."""
    Kp, Np = b.shape
    return b.reshape(Kp // tk, tk, Np // tn, tn).transpose(0, 2, 1, 3)


def untile(packed: np.ndarray) -> np.ndarray:
    """[Kp/tk, Np/tn, tk, tn] -> [Kp, Np]: what the kernel computes with. Split weights [2, ...] give hi + lo
    (exact in fp32), which is what the two MAC passes into one fp32 accumulator compute with."""
    if packed.ndim == 5:
        packed = packed.astype(np.float32).sum(axis=0)
    kt, nt, tk, tn = packed.shape
    return packed.transpose(0, 2, 1, 3).reshape(kt * tk, nt * tn)


def _bias(recipe, sources):
    parts = []
    for src, n in zip(recipe["sources"], recipe["n"]):
        parts.append(np.zeros(n, np.float32) if src is None else apply_views(np.asarray(sources[src[0]]), src[1]))
    b = np.concatenate(parts).astype(np.float32)
    return np.pad(b, (0, recipe["np"] - b.size)).astype(np.float32)


_PACKERS = {"plain": _plain, "gemm_b": _gemm_b, "bias": _bias}


def weights_image(program: Program, weights: Mapping[str, np.ndarray]) -> np.ndarray:
    """The bytes of the weights arena: every WEIGHTS buffer packed and placed at its offset."""
    recipes = program.meta["layout"]
    shapes = program.meta["source_shapes"]
    # constants come back from disk as stored; a 0-d constant may come back as [1]
    constants = {n: np.reshape(a, shapes[n]) if n in shapes else a for n, a in program.constants.items()}
    sources = {**weights, **constants}
    needed = {s[0]: s for r in recipes.values() for s in r["sources"] if s is not None}
    missing = [n for n in needed if n not in sources]
    misshaped = [f"{n} {tuple(np.shape(sources[n]))} != {tuple(shapes[n])}" for n in needed
                 if n in sources and tuple(np.shape(sources[n])) != tuple(shapes[n])]
    if missing or misshaped:
        raise WeightError("the weights do not fit the program", missing=missing, misshaped=misshaped,
                          fix="load the checkpoint through the model's load function, which maps and checks names")
    image = np.zeros(program.meta["arenas"]["weights"], np.uint8)
    for name, buf in program.buffers_of(Usage.WEIGHTS).items():
        packed = pack(recipes[name], sources)
        assert packed.nbytes == buf.nbytes, (name, packed.shape, buf.shape)
        image[buf.offset:buf.offset + buf.nbytes] = np.frombuffer(packed.tobytes(), np.uint8)
    return image

