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
    data, fix = _read_checkpoint(path)
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


def _read_checkpoint(path: Path) -> tuple[bytes, str]:
    """The file's bytes, and the fix to give when they turn out to be damaged."""
    try:
        return path.read_bytes(), f"the file is damaged: delete {path} and fetch or export it again"
    except OSError as e:
        raise WeightError(f"cannot read checkpoint {path}: {e.strerror}", fix="check the path") from None


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
    """The entries of a config dict that are fields of dataclass `cls` (unknown keys, and `skip`, ignored)."""
    from dataclasses import fields
    return {f.name: d[f.name] for f in fields(cls) if f.name in d and f.name not in skip}


def read_config(folder: str | Path) -> dict:
    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text())
    except OSError:
        raise WeightError(f"no config.json in {folder}", fix="point at a model folder with config.json") from None
    except ValueError as e:
        raise WeightError(f"{path} is not valid JSON: {e}", fix="restore the file from its source") from None


# CTranslate2 model.bin: u32 version, string spec name, u32 spec revision, u32 count, then per variable
# string name, u8 rank, rank x u32 dims, u8 dtype code, u32 byte count, raw bytes; then u32 alias count and
# (alias, target) string pairs. Strings are u16 length (incl. the trailing NUL) + UTF-8. Little-endian.
_CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}


def read_ctranslate2(path: str | Path) -> dict[str, np.ndarray]:
    """All variables of a CTranslate2 `model.bin` (format version >= 5) as numpy arrays, aliases resolved
    (an alias maps to the same array as its target). bf16 is widened to float32; other dtypes are kept."""
    path = Path(path)
    data, fix = _read_checkpoint(path)
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
        raw = take(u("H", what), what)
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
        if code == 5:
            import ml_dtypes
            array = np.frombuffer(raw, ml_dtypes.bfloat16).astype(np.float32)
        else:
            array = np.frombuffer(raw, _CT2_DTYPES[code])
        if array.size != int(np.prod(dims, dtype=np.int64)):
            raise WeightError(f"{path}: variable {name!r} has {array.size} values for shape {dims}", fix=fix)
        out[name] = array.reshape(dims)
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
