"""Issue #26 items 2 and 9 (model folders): every malformed checkpoint, config, shard index, tokenizer and
vocabulary is a WeightError that names the file, before anything large is allocated; a shard index cannot
make us read outside the model folder."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from sdk.errors import WeightError
from sdk.models import bert, conformer
from sdk.vocab import read_tokenizer, read_vocabulary
from sdk.weights import read_config, read_safetensors, read_safetensors_shards

from .conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[1]


def _safetensors(header, data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


@pytest.mark.parametrize("header, data, message", [
    ([1, 2], b"", "is a JSON list"),
    ({"w": "F32"}, b"", "header entry of type str"),
    ({"w": {"dtype": "F32", "shape": [2]}}, bytes(8), "invalid data_offsets None"),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}}, bytes(8), "negative or reversed"),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, bytes(8), "negative or reversed"),
    ({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8), r"shape \[3\] of F32 needs 12"),
    ({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 3]}}, bytes(8), "holds 3 bytes"),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(4), "is truncated"),
    ({"w": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}}, bytes(8), "invalid shape"),
    ({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, bytes(8), "unsupported dtype"),
    ({"v": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "w": {"dtype": "F16", "shape": [2], "data_offsets": [4, 8]}}, bytes(8), "'v' and 'w' overlap"),
])
def test_malformed_safetensors_headers_are_weight_errors(tmp_path, header, data, message):
    path = tmp_path / "model.safetensors"
    path.write_bytes(_safetensors(header, data))
    with pytest.raises(WeightError, match=message) as e:
        read_safetensors(path)
    assert str(path) in str(e.value) and e.value.fix


def test_a_header_declaring_petabytes_is_refused_without_allocating(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 1 << 50) + b"{}")
    with pytest.raises(WeightError, match="declares a 1,125,899,906,842,624-byte header"):
        read_safetensors(path)


def _resident_kib(path: Path) -> int:
    """KiB of `path`'s pages mapped into this process (Rss of its mappings in /proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1] in "0123456789abcdef" and "-" in line.split()[0]:
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_a_tensors_file_pages_leave_the_process_with_its_arrays(tmp_path):
    """One map serves the file, but a tensor nobody holds costs no memory: the original of a weight the cpu backend
    keeps transposed, or the fp16 of a widened one, does not stay resident beside its copy."""
    n = 1 << 20  # values: 4 MiB of F32, 2 MiB of F16
    header = {"a": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]},
              "b": {"dtype": "F16", "shape": [n], "data_offsets": [4 * n, 6 * n]}}
    path = tmp_path / "model.safetensors"
    path.write_bytes(_safetensors(header, np.ones(n, np.float32).tobytes() + np.ones(n, np.float16).tobytes()))
    tensors = read_safetensors(path)
    assert tensors["b"].dtype == np.float32 and tensors["b"].sum() == n  # widened, its fp16 pages already gone
    view = tensors["a"].reshape(2, -1)
    assert view.sum() == n and _resident_kib(path) >= 4 << 10
    del tensors
    assert _resident_kib(path) >= 4 << 10  # the view still reads them
    del view
    assert _resident_kib(path) == 0


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "folder"])
def test_a_device_fifo_or_folder_in_place_of_a_model_file_is_refused_without_reading(tmp_path, special):
    folder = tmp_path / "m"
    shutil.copytree(FIXTURES / "bert", folder)
    for name in ("model.safetensors", "config.json"):
        (folder / name).unlink()
        if special == "fifo":
            os.mkfifo(folder / name)  # opening it would block forever
        elif special == "folder":
            (folder / name).mkdir()
        else:
            (folder / name).symlink_to(special)
    with pytest.raises(WeightError, match="folder|not a regular file"):
        read_config(folder)
    with pytest.raises(WeightError, match="folder|not a regular file"):
        read_safetensors(folder / "model.safetensors")


@pytest.mark.parametrize("doc, message", [
    ([1, 2, 3], "holds a JSON list, not an object"),
    ({"num_hidden_layers": 1000000000}, "num_hidden_layers is 1000000000; it must be an integer from 1 to 1,024"),
    ({"num_attention_heads": 0}, "num_attention_heads is 0"),
    ({"hidden_size": "32"}, "hidden_size is '32'"),
    ({"hidden_size": True}, "hidden_size is True"),
    ({"hidden_size": 30, "num_attention_heads": 4}, "does not split into"),
    ({"text_config": {"vocab_size": -1}}, "text_config.vocab_size is -1"),
    ({"depths": [3, 0]}, r"depths is \[3, 0\]"),
])
def test_configs_out_of_bounds_are_refused_before_any_allocation(tmp_path, doc, message):
    folder = tmp_path / "m"
    shutil.copytree(FIXTURES / "bert", folder)
    config = json.loads((FIXTURES / "bert" / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(doc if isinstance(doc, list) else config | doc))
    with pytest.raises(WeightError, match=message):
        bert.load(folder)


def test_a_billion_layers_config_stays_within_256_mb(tmp_path):
    """The case that was OOM-killed at 23 GB: a subprocess with a 256 MB address-space limit gets the error."""
    folder = tmp_path / "m"
    shutil.copytree(FIXTURES / "bert", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 10 ** 9}))
    code = textwrap.dedent(f"""
        import resource, sys
        from sdk.models import bert
        from sdk.errors import WeightError
        resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))
        try:
            bert.load({str(folder)!r})
        except WeightError as e:  # VmHWM: ru_maxrss would include the parent's size from before exec
            status = open("/proc/self/status").read().splitlines()
            print("typed", next(line.split()[1] for line in status if line.startswith("VmHWM:")))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.stdout.startswith("typed"), (r.returncode, r.stdout, r.stderr[-2000:])
    assert int(r.stdout.split()[1]) < 256 * 1024, r.stdout  # KiB


def _sharded(tmp_path) -> Path:
    """The Parakeet CTC fixture split into two shards with an index, as large checkpoints ship."""
    from safetensors.numpy import save_file
    folder = tmp_path / "parakeet"
    shutil.copytree(FIXTURES / "conformer" / "parakeet_ctc", folder)
    tensors = read_safetensors(folder / "model.safetensors")
    names = sorted(tensors)
    (folder / "model.safetensors").unlink()
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in halves.items():
        save_file({k: np.array(tensors[k]) for k in keys}, str(folder / shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: shard for shard, keys in halves.items() for k in keys}}))
    return folder


def test_a_sharded_checkpoint_loads_like_the_single_file(tmp_path):
    folder = _sharded(tmp_path)
    ours = conformer.load(folder)[1]
    reference = conformer.load(FIXTURES / "conformer" / "parakeet_ctc")[1]
    assert ours.keys() == reference.keys() and all(np.array_equal(ours[k], reference[k]) for k in ours)


@pytest.mark.parametrize("escape", ["../outside.safetensors", "/dev/zero", "sub/../../outside.safetensors",
                                    "link.safetensors"])
def test_a_shard_index_cannot_read_outside_the_model_folder(tmp_path, escape):
    folder = _sharded(tmp_path)
    shutil.copy(folder / "model-00001-of-00002.safetensors", tmp_path / "outside.safetensors")
    (folder / "link.safetensors").symlink_to(tmp_path / "outside.safetensors")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: escape if v.startswith("model-00001") else v for k, v in index["weight_map"].items()}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightError, match="outside the model folder"):
        read_safetensors_shards(folder)


@pytest.mark.parametrize("text, message", [
    ("{not json", "is not valid JSON"),
    ('{"metadata": {}}', "has no weight_map"),
    ("[1, 2]", "has no weight_map"),
    ('{"weight_map": {"a": 3}}', "has no weight_map"),
    ('{"weight_map": {"a": "model-00001-of-00002.safetensors"}}', "lacks tensors its index assigns"),
])
def test_malformed_shard_indexes_are_weight_errors(tmp_path, text, message):
    folder = _sharded(tmp_path)
    (folder / "model.safetensors.index.json").write_text(text)
    with pytest.raises(WeightError, match=message):
        conformer.load(folder)


def test_an_invalid_tokenizer_json_and_a_non_utf8_vocabulary_are_weight_errors(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "Nonsense"}}')
    with pytest.raises(WeightError, match="is not a valid tokenizer.json"):
        read_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(WeightError, match="is not UTF-8"):
        read_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "vocabulary.txt").write_bytes(b"<|endoftext|>\n\xff\xfe\n")
    with pytest.raises(WeightError, match=r"is not UTF-8 text \(line 2\)"):
        read_vocabulary(tmp_path / "vocabulary.txt")


def test_whisper_ct2_with_zero_heads_is_a_weight_error(tmp_path):
    folder = tmp_path / "ct2"
    shutil.copytree(FIXTURES / "whisper" / "ct2", folder)
    data = bytearray((folder / "model.bin").read_bytes())
    name = b"encoder/num_heads\0"
    at = data.index(name) + len(name)  # then rank (u8, 0 for a scalar), dtype (u8), byte count (u32), value
    assert data[at] == 0
    size = struct.unpack_from("<I", data, at + 2)[0]
    data[at + 6:at + 6 + size] = bytes(size)
    (folder / "model.bin").write_bytes(bytes(data))
    from sdk.models import whisper
    with pytest.raises(WeightError, match="encoder/num_heads is \\[0\\]"):
        whisper.load(folder)


def test_bench_on_a_malformed_model_folder_is_a_typed_error(tmp_path):
    from typer.testing import CliRunner

    from apps.main import app
    folder = tmp_path / "m"
    shutil.copytree(FIXTURES / "bert", folder)
    (folder / "config.json").write_text("[1]")
    r = CliRunner().invoke(app, ["bench", str(folder)])
    assert r.exit_code == 1 and "holds a JSON list" in r.stderr and "fix:" in r.stderr
    assert not isinstance(r.exception, Exception) or isinstance(r.exception, SystemExit)
