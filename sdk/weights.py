"""Checkpoint readers and name maps.

A model file declares the shapes it expects (`param_shapes(cfg)`) and a WEIGHT_MAP: rows of
(our name, checkpoint name) templates, where `{i}`/`{j}` stand for indices and `{name}`
for any suffix. `map_weights` applies the
table and refuses a checkpoint that does not fit, listing missing, unused and misshaped keys.
Weights leave here as float32 numpy arrays, converted once.
"""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from .errors import WeightError

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32,
              "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """All tensors of a .safetensors file as numpy arrays (bf16 widened to float32 via ml_dtypes).

    Reads the format directly (8-byte header length, JSON header, raw data) so that a truncated or
    corrupt file is reported precisely instead of failing deep inside a library."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise WeightError(f"cannot read checkpoint {path}: {e.strerror}", fix="check the path") from None
    fix = f"the file is damaged: delete {path} and fetch or export it again"
    if len(data) < 8:
        raise WeightError(f"{path} is not a safetensors file ({len(data)} bytes)", fix=fix)
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8:8 + n])
    except (ValueError, UnicodeDecodeError):
        raise WeightError(f"{path} has no readable safetensors header", fix=fix) from None
    header.pop("__metadata__", None)
    out, base = {}, 8 + n
    for name, info in header.items():
        start, end = info["data_offsets"]
        if base + end > len(data):
            raise WeightError(f"{path} is truncated: tensor {name!r} needs bytes up to {base + end}, the file has "
                              f"{len(data)}", fix=fix)
        raw = data[base + start:base + end]
        if info["dtype"] == "BF16":
            import ml_dtypes
            array = np.frombuffer(raw, ml_dtypes.bfloat16).astype(np.float32)
        elif info["dtype"] in _ST_DTYPES:
            array = np.frombuffer(raw, _ST_DTYPES[info["dtype"]])
        else:
            raise WeightError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        out[name] = array.reshape(info["shape"])
    return out


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


def read_config(folder: str | Path) -> dict:
    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text())
    except OSError:
        raise WeightError(f"no config.json in {folder}", fix="point at a model folder with config.json") from None
    except ValueError as e:
        raise WeightError(f"{path} is not valid JSON: {e}", fix="restore the file from its source") from None
