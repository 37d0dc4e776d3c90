"""Checkpoint readers and name maps.

A model file declares the shapes it expects (`param_shapes(cfg)`) and a WEIGHT_MAP: rows of
(our name, checkpoint name) templates, where `{i}`/`{j}` stand for indices and `{name}`
for any suffix. `map_weights` applies the
table and refuses a checkpoint that does not fit, listing missing, unused and misshaped keys.
Weights leave here as float32 numpy arrays, converted once.
"""
from __future__ import annotations

import json
import math
import mmap
import os
import re
import stat
import struct
import weakref
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from .errors import WeightError

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32,
              "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


# Where a header or a config declares sizes, they are checked before anything is allocated: a file can
# declare any size, and the memory of the machine is not the limit to find out by.
SAFETENSORS_HEADER_LIMIT = 100 << 20  # the safetensors spec's own cap on the JSON header
MODEL_FILE_LIMIT = 64 << 20           # config.json, tokenizer.json, vocabularies, shard indexes


def read_model_file(path: str | Path, *, limit: int = MODEL_FILE_LIMIT, what: str = "model file") -> bytes:
    """The bytes of a small file of a model folder: a regular file (not a FIFO or a device, which never end)
    of at most `limit` bytes, else a WeightError that names it."""
    path = Path(path)
    info = _regular_file(path, what)
    if info.st_size > limit:
        raise WeightError(f"{path} is {info.st_size:,} bytes, more than a {what} can be ({limit:,})",
                          fix=f"the file is not a {what}: restore it from the model's source")
    try:
        return path.read_bytes()[:limit]
    except OSError as e:
        raise WeightError(f"cannot read {path}: {e.strerror}", fix="check the file's permissions") from None


def _regular_file(path: Path, what: str) -> os.stat_result:
    try:
        info = path.stat()
    except FileNotFoundError:
        raise WeightError(f"{path} does not exist", fix=f"use a complete model folder (it needs its {what})") from None
    except OSError as e:
        raise WeightError(f"cannot read {path}: {e.strerror}", fix="check the path and its permissions") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file (a device, FIFO or socket)"
        raise WeightError(f"{path} is {kind}", fix=f"point at the model's real {what}")
    return info


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """All tensors of a .safetensors file as numpy arrays (fp16 and bf16 widened to float32).

    Reads the format directly (8-byte header length, JSON header, raw data), memory-mapped, so that a
    truncated or corrupt file is reported precisely instead of failing deep inside a library, and a tensor
    costs no memory until it is used, and none once its arrays are gone (`_mapped_array`). Every entry of the
    header is checked against the file."""
    path = Path(path)
    data, fix = _map_checkpoint(path, "checkpoint")
    if len(data) < 8:
        raise WeightError(f"{path} is not a safetensors file ({len(data)} bytes)", fix=fix)
    (n,) = struct.unpack("<Q", data[:8])
    if n > min(SAFETENSORS_HEADER_LIMIT, len(data) - 8):
        raise WeightError(f"{path} declares a {n:,}-byte header, but the file has {len(data):,} bytes"
                          + (f" (the format allows {SAFETENSORS_HEADER_LIMIT:,})" if n > SAFETENSORS_HEADER_LIMIT else ""),
                          fix=fix)
    try:
        header = json.loads(bytes(data[8:8 + n]))
    except (ValueError, UnicodeDecodeError):
        raise WeightError(f"{path} has no readable safetensors header", fix=fix) from None
    if not isinstance(header, dict):
        raise WeightError(f"{path}: the safetensors header is a JSON {type(header).__name__}, not an object", fix=fix)
    header.pop("__metadata__", None)
    base = 8 + n
    entries = {name: _tensor_entry(path, name, info, len(data) - base, fix) for name, info in header.items()}
    # tensors may not share bytes (the format's rule): widened copies then never add up to more than twice the file
    spans = sorted((start, end, name) for name, (_, _, start, end) in entries.items() if end > start)
    for (_, end, name), (start, _, other) in zip(spans, spans[1:]):
        if start < end:
            raise WeightError(f"{path}: tensors {name!r} and {other!r} overlap in the file", fix=fix)
    return {name: _mapped_array(data, base + start, base + end, _ST_DTYPES.get(dtype, dtype)).reshape(shape)
            for name, (dtype, shape, start, end) in entries.items()}


_ITEM_SIZE = {"BF16": 2, **{k: np.dtype(v).itemsize for k, v in _ST_DTYPES.items()}}


def _tensor_entry(path: Path, name: str, info, available: int, fix: str) -> tuple[str, list[int], int, int]:
    """(dtype, shape, start, end) of one header entry, each checked: the offsets inside the data, in order,
    and exactly the bytes the shape needs."""
    def bad(why: str):
        return WeightError(f"{path}: tensor {name!r} {why}", fix=fix)
    if not isinstance(info, dict):
        raise bad(f"has a header entry of type {type(info).__name__}, not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in _ITEM_SIZE:
        raise WeightError(f"{path}: tensor {name!r} has unsupported dtype {dtype!r}",
                          fix=f"use one of {', '.join(_ITEM_SIZE)}, or {fix}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise bad(f"has an invalid shape {shape!r} (a list of non-negative integers is expected)")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)):
        raise bad(f"has invalid data_offsets {offsets!r} (two integers [start, end] are expected)")
    start, end = offsets
    if not 0 <= start <= end:
        raise bad(f"has data_offsets [{start}, {end}] that are negative or reversed")
    if end > available:
        raise WeightError(f"{path} is truncated: tensor {name!r} needs bytes up to {end} of the data, the file has "
                          f"{available}", fix=fix)
    needed = int(np.prod(shape, dtype=object)) * _ITEM_SIZE[dtype]
    if end - start != needed:
        raise bad(f"holds {end - start} bytes, but shape {shape} of {dtype} needs {needed}")
    return dtype, shape, start, end


def _mapped_array(data: memoryview, start: int, end: int, dtype) -> np.ndarray:
    """Bytes [start, end) of a memory-mapped checkpoint as a 1-d array of `dtype`; "BF16" and float16 are widened
    to float32 (a copy). The file's pages a tensor spans leave this process with the last array over them: one
    map serves the whole file, and without this every page anyone read would stay resident as long as any tensor
    of it lives, such as the originals of weights the cpu backend keeps transposed, or the fp16 of a widened
    checkpoint beside its float32 copy (the kernel reads a page again if a neighbouring tensor needs it)."""
    raw = data[start:end]
    if dtype in ("BF16", np.float16):
        import ml_dtypes
        widened = np.frombuffer(raw, ml_dtypes.bfloat16 if dtype == "BF16" else np.float16).astype(np.float32)
        _drop_pages(data.obj, start, end)  # read once, never again
        return widened
    array = np.frombuffer(raw, dtype)
    if raw.nbytes:
        weakref.finalize(array, _drop_pages, data.obj, start, end).atexit = False
    return array


def _drop_pages(mapped: mmap.mmap, start: int, end: int):
    """Release the whole pages inside bytes [start, end) of a read-only file map from this process (the page cache
    keeps them; a later read maps them again)."""
    first, last = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        mapped.madvise(mmap.MADV_DONTNEED, first, last - first)


def _map_checkpoint(path: Path, what: str):
    """The file's bytes memory-mapped (an empty file as b""), and the fix to give when they turn out damaged."""
    _regular_file(path, what)
    fix = f"the file is damaged: delete {path} and fetch or export it again"
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return b"", fix
            return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)), fix
    except (OSError, ValueError) as e:
        raise WeightError(f"cannot read checkpoint {path}: {getattr(e, 'strerror', None) or e}",
                          fix="check the path") from None


def read_safetensors_shards(folder: str | Path, index_name: str = "model.safetensors.index.json") -> dict[str, np.ndarray]:
    """Every tensor of a sharded checkpoint: the index's `weight_map` (tensor -> shard file) is checked, each
    shard must be a file inside `folder` (an index cannot make us read elsewhere), and every tensor the index
    lists must be in the shard it names."""
    folder = Path(folder)
    index = folder / index_name
    fix = f"restore {index_name} from the model's source"
    try:
        doc = json.loads(read_model_file(index, what="shard index"))
    except (ValueError, UnicodeDecodeError) as e:
        raise WeightError(f"{index} is not valid JSON: {e}", fix=fix) from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in weight_map.items()):
        raise WeightError(f"{index} has no weight_map object (tensor name -> shard file)", fix=fix)
    root = folder.resolve()
    ckpt: dict[str, np.ndarray] = {}
    for shard in sorted(set(weight_map.values())):
        path = (folder / shard).resolve()
        if Path(shard).is_absolute() or root not in path.parents:
            raise WeightError(f"{index} names shard {shard!r}, which is outside the model folder {folder}",
                              fix="a shard index may only name files in its own folder; restore it from the source")
        tensors = read_safetensors(folder / shard)
        missing = sorted(k for k, v in weight_map.items() if v == shard and k not in tensors)
        if missing:
            raise WeightError(f"{folder / shard} lacks tensors its index assigns to it", missing=missing, fix=fix)
        ckpt |= tensors
    return ckpt


def _template_regex(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{j\}", r"(?P<j>\d+)")
                      .replace(r"\{name\}", r"(?P<name>.+)") + "$")


def map_weights(checkpoint: Mapping[str, np.ndarray], table: Sequence[tuple[str, str]],
                expected: Mapping[str, tuple], *, ignore: Iterable[str] = (), source: str = "checkpoint",
                prefixes: Sequence[str] = ("",)) -> dict[str, np.ndarray]:
    """Rename checkpoint tensors to our names via `table`, check every shape, and return float32 arrays.

    `ignore` lists regexes of checkpoint keys that are known and deliberately unused (e.g. heads we do
    not run). `prefixes` are tried in order on checkpoint names (e.g. "" and "bert.")."""
    rows = [(_template_regex(ours), theirs) for ours, theirs in table]
    prefix = next((p for p in prefixes if any(k.startswith(p) for k in checkpoint) and p), "")
    out, missing, misshaped, used = {}, [], [], set()
    for name, shape in expected.items():
        for regex, theirs in rows:
            m = regex.match(name)
            if m:
                key = prefix + theirs.format(**m.groupdict())
                break
        else:
            raise WeightError(f"the model's weight table has no row for {name!r} (a bug in the model file)")
        if key not in checkpoint:
            missing.append(key)
            continue
        used.add(key)
        array = checkpoint[key]
        if tuple(array.shape) != tuple(shape):
            misshaped.append(f"{key} {tuple(array.shape)}, expected {tuple(shape)}")
            continue
        out[name] = np.ascontiguousarray(array, dtype=np.float32)
    skip = [re.compile(p) for p in ignore]
    unused = sorted(k for k in checkpoint if k not in used and not any(p.search(k) for p in skip))
    if missing or misshaped or unused:
        raise WeightError(f"{source} does not match the model", missing=missing, unused=unused,
                          misshaped=misshaped,
                          fix="check that the checkpoint and its config.json belong together and name a "
                              "supported architecture")
    return out


def known_fields(cls, d: dict, *, skip: tuple[str, ...] = ()) -> dict:
    """The entries of a config dict that are fields of dataclass `cls` (unknown keys, `skip` and nulls
    ignored), each checked against the field's type: a WeightError names the first that does not fit."""
    from dataclasses import fields
    out = {}
    for f in fields(cls):
        if f.name in d and f.name not in skip and d[f.name] is not None:
            value = d[f.name]
            if not _fits(value, str(f.type)):
                raise WeightError(f"config.json: {f.name} is {value!r}, not a value of type {f.type}",
                                  fix="restore config.json from the model's source")
            out[f.name] = value
    return out


def _fits(value, annotation: str) -> bool:
    scalar = {"int": lambda v: type(v) is int, "bool": lambda v: type(v) is bool, "str": lambda v: type(v) is str,
              "float": lambda v: type(v) in (int, float) and math.isfinite(v)}
    if annotation in scalar:
        return scalar[annotation](value)
    if annotation.startswith("tuple[") and annotation.endswith(", ...]"):
        inner = annotation[6:-6]
        return isinstance(value, (list, tuple)) and all(_fits(v, inner) for v in value)
    return True  # nested configs and unions: their own from_dict checks them


# Sane bounds for the sizes a config.json declares: (smallest, largest). Far above every real model, far
# below what would exhaust memory: a config with a billion layers is refused here, not by the OOM killer.
_LAYERS, _HEADS, _WIDTH, _POSITIONS = (1, 1024), (1, 1024), (1, 1 << 17), (1, 1 << 20)
CONFIG_BOUNDS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("num_hidden_layers", "encoder_layers", "decoder_layers", "num_decoder_layers"), _LAYERS),
    **dict.fromkeys(("num_attention_heads", "encoder_attention_heads", "decoder_attention_heads",
                     "num_key_value_heads"), _HEADS),
    **dict.fromkeys(("hidden_size", "intermediate_size", "d_model", "encoder_ffn_dim", "decoder_ffn_dim",
                     "embedding_size", "decoder_hidden_size", "joint_hidden_size", "subsampling_conv_channels"),
                    _WIDTH),
    **dict.fromkeys(("max_position_embeddings", "max_source_positions", "max_target_positions"), _POSITIONS),
    "projection_dim": (0, 1 << 17), "vocab_size": (1, 1 << 22), "type_vocab_size": (0, 1 << 16),
    "num_mel_bins": (1, 1024), "image_size": (1, 1 << 14), "patch_size": (1, 1 << 14), "num_channels": (1, 64),
    "conv_kernel_size": (1, 1024), "subsampling_factor": (1, 64), "num_labels": (0, 1 << 20),
    "num_register_tokens": (0, 1024), "hidden_sizes": _WIDTH, "depths": _LAYERS,
}
# (width, heads): the width must split evenly into heads
_HEAD_SPLITS = (("hidden_size", "num_attention_heads"), ("d_model", "encoder_attention_heads"),
                ("d_model", "decoder_attention_heads"))


def read_config(folder: str | Path) -> dict:
    """config.json of a model folder as a dict, with every size it declares checked (CONFIG_BOUNDS), in
    nested sections too (CLIP's text_config, GigaAM's encoder)."""
    path = Path(folder) / "config.json"
    if not path.exists() and not path.is_symlink():
        raise WeightError(f"no config.json in {folder}", fix="point at a model folder with config.json")
    doc = read_json_object(path, "config.json")
    _check_sizes(doc, path, "")
    return doc


def read_json_object(path: str | Path, what: str) -> dict:
    """A small JSON file of a model folder that must hold one object (configs, preprocessor settings)."""
    path = Path(path)
    try:
        doc = json.loads(read_model_file(path, what=what))
    except (ValueError, UnicodeDecodeError) as e:
        raise WeightError(f"{path} is not valid JSON: {e}", fix="restore the file from its source") from None
    if not isinstance(doc, dict):
        raise WeightError(f"{path} holds a JSON {type(doc).__name__}, not an object",
                          fix="restore the file from its source")
    return doc


def _check_sizes(doc: dict, path: Path, where: str) -> None:
    fix = "restore config.json from the model's source (it must match the checkpoint)"
    for key, value in doc.items():
        if isinstance(value, dict):
            _check_sizes(value, path, f"{where}{key}.")
        elif key in CONFIG_BOUNDS:
            low, high = CONFIG_BOUNDS[key]
            listed = key in ("hidden_sizes", "depths")  # the only sizes that are lists
            for v in value if listed and isinstance(value, list) else [value]:
                if type(v) is not int or not low <= v <= high:
                    raise WeightError(f"{path}: {where}{key} is {value!r}; it must be an integer from {low} to "
                                      f"{high:,}", fix=fix)
    for width, heads in _HEAD_SPLITS:
        w, h = doc.get(width), doc.get(heads)
        if type(w) is int and type(h) is int and w % h:
            raise WeightError(f"{path}: {where}{width} {w} does not split into {where}{heads} {h} heads", fix=fix)


# CTranslate2 model.bin: u32 version, string spec name, u32 spec revision, u32 count, then per variable
# string name, u8 rank, rank x u32 dims, u8 dtype code, u32 byte count, raw bytes; then u32 alias count and
# (alias, target) string pairs. Strings are u16 length (incl. the trailing NUL) + UTF-8. Little-endian.
_CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "BF16"}


def read_ctranslate2(path: str | Path) -> dict[str, np.ndarray]:
    """All variables of a CTranslate2 `model.bin` (format version >= 5) as numpy arrays, aliases resolved
    (an alias maps to the same array as its target). fp16 and bf16 are widened to float32 one variable at a time,
    so that the file's fp16 is never resident beside all of its float32 copy; other dtypes are kept."""
    path = Path(path)
    data, fix = _map_checkpoint(path, "model.bin")
    pos = 0

    def take(n: int, what: str) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise WeightError(f"{path} is truncated: {what} needs bytes up to {pos + n}, the file has {len(data)}",
                              fix=fix)
        pos += n
        return data[pos - n:pos]

    def u(fmt: str, what: str) -> int:
        return struct.unpack("<" + fmt, take(struct.calcsize(fmt), what))[0]

    def string(what: str) -> str:
        raw = bytes(take(u("H", what), what))
        try:
            return raw.rstrip(b"\0").decode("utf-8")
        except UnicodeDecodeError:
            raise WeightError(f"{path}: {what} is not UTF-8 at byte {pos}", fix=fix) from None

    version = u("I", "the format version")
    if not 5 <= version <= 6:
        raise WeightError(f"{path} is not a CTranslate2 model.bin we can read (format version {version}, "
                          f"expected 5 or 6)", fix="convert the model with a CTranslate2 release from 2022 or later")
    string("the spec name")
    u("I", "the spec revision")
    out: dict[str, np.ndarray] = {}
    for k in range(u("I", "the variable count")):
        name = string(f"variable {k}'s name")
        dims = [u("I", f"{name}'s shape") for _ in range(u("B", f"{name}'s rank"))]
        code = u("B", f"{name}'s dtype")
        if code not in _CT2_DTYPES:
            raise WeightError(f"{path}: variable {name!r} has unknown dtype code {code}", fix=fix)
        raw = take(u("I", f"{name}'s size"), f"variable {name!r}")
        if code != 5 and len(raw) % np.dtype(_CT2_DTYPES[code]).itemsize or code == 5 and len(raw) % 2:
            raise WeightError(f"{path}: variable {name!r} has {len(raw)} bytes, not a whole number of values",
                              fix=fix)
        array = _mapped_array(data, pos - len(raw), pos, _CT2_DTYPES[code])
        if array.size != int(np.prod(dims, dtype=np.int64)):
            raise WeightError(f"{path}: variable {name!r} has {array.size} values for shape {dims}", fix=fix)
        out[name] = array.reshape(dims)
        if name.endswith("num_heads") and (array.size != 1 or not 1 <= int(array.reshape(-1)[0]) <= 1024):
            raise WeightError(f"{path}: {name} is {array.reshape(-1)[:4].tolist()}, not a head count from 1 to 1024",
                              fix=fix)
    for _ in range(u("I", "the alias count")):
        alias, target = string("an alias"), string("an alias target")
        if target not in out:
            raise WeightError(f"{path}: alias {alias!r} points at missing variable {target!r}", fix=fix)
        out[alias] = out[target]
    return out


def read_ctranslate2_spec(path: str | Path) -> str:
    """The spec name in a CTranslate2 `model.bin`'s header ("WhisperSpec" for Whisper), reading only the
    header, so a folder can be told apart before its weights are read."""
    path = Path(path)
    fix = f"the file is damaged: delete {path} and fetch or export it again"
    try:
        with open(path, "rb") as f:
            head = f.read(6 + 0xFFFF)
    except OSError as e:
        raise WeightError(f"cannot read checkpoint {path}: {e.strerror}", fix="check the path") from None
    if len(head) < 6:
        raise WeightError(f"{path} is truncated: its header needs 6 bytes, the file has {len(head)}", fix=fix)
    version, length = struct.unpack_from("<IH", head)
    if not 5 <= version <= 6:
        raise WeightError(f"{path} is not a CTranslate2 model.bin we can read (format version {version}, "
                          f"expected 5 or 6)", fix="convert the model with a CTranslate2 release from 2022 or later")
    if len(head) < 6 + length:
        raise WeightError(f"{path} is truncated inside its spec name", fix=fix)
    return head[6:6 + length].rstrip(b"\0").decode("utf-8", "replace")
