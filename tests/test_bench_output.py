"""`aie-apps bench` output: every row says what it is (estimate, emulated, measured) and nothing reads as a
measurement that is not one; a model folder is recognised by what it holds, not by a file name."""
from __future__ import annotations

import shutil
import struct

from typer.testing import CliRunner

from apps.main import app
from sdk.weights import read_ctranslate2_spec

from .conftest import FIXTURES

runner = CliRunner()


def test_estimate_rows_name_only_the_parts_that_take_time():
    r = runner.invoke(app, ["bench", "minilm", "--estimate-only", "--target", "npu2"])
    assert r.exit_code == 0, r.output
    (row,) = [line for line in r.stdout.splitlines() if "ESTIMATE" in line]
    # at seq 128 every MiniLM kernel on npu2 waits on DRAM, not on its MACs: no "compute 0.0 ms" part
    assert "in kernels bound by DRAM traffic" in row and "bound by compute" not in row
    assert "0.0 ms" not in row and " 0 us" not in row and "1 dispatch," in row


def test_measured_rows_say_where_they_were_measured():
    args = ["bench", str(FIXTURES / "bert"), "--length", "16", "--runs", "2", "--device"]   # 16: a TextEmbedder bucket
    emu = runner.invoke(app, [*args, "emu"])
    assert emu.exit_code == 0, emu.output
    (row,) = [line for line in emu.stdout.splitlines() if "emulated" in line]
    assert row.startswith("  forward_b1_t16: emulated, per run: 1 dispatch, 0 host steps, 2 syncs,")
    assert "not NPU time" in row and "measured on emulated" not in emu.stdout
    cpu = runner.invoke(app, [*args, "cpu"])
    assert cpu.exit_code == 0, cpu.output
    (row,) = [line for line in cpu.stdout.splitlines() if "measured on" in line]
    assert row.startswith("  forward_b1_t16: measured on the CPU: ") and row.endswith("per run (wall time, mean of 2)")


def ct2_header(spec: str) -> bytes:
    """A CTranslate2 model.bin with no variables: version 6, spec name, revision, 0 variables, 0 aliases."""
    name = spec.encode() + b"\0"
    return struct.pack("<IH", 6, len(name)) + name + struct.pack("<III", 1, 0, 0)


def test_bench_takes_a_model_bin_for_whisper_only_when_it_is_one(tmp_path):
    assert read_ctranslate2_spec(FIXTURES / "whisper" / "ct2" / "model.bin") == "WhisperSpec"
    translator = tmp_path / "nllb"
    translator.mkdir()
    (translator / "model.bin").write_bytes(ct2_header("TransformerSpec"))
    r = runner.invoke(app, ["bench", str(translator), "--estimate-only"])
    assert r.exit_code == 1 and "is a CTranslate2 TransformerSpec model, not Whisper" in r.stderr, r.output
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "model.bin").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    r = runner.invoke(app, ["bench", str(junk), "--estimate-only"])
    assert r.exit_code == 1 and "is not a CTranslate2 model.bin we can read" in r.stderr, r.output
    r = runner.invoke(app, ["bench", str(tmp_path), "--estimate-only"])
    assert r.exit_code == 1 and "is not a model folder" in r.stderr, r.output
    bert = shutil.copytree(FIXTURES / "bert", tmp_path / "bert")
    (bert / "model.bin").write_bytes(ct2_header("WhisperSpec"))  # a stray file: config.json says what it is
    r = runner.invoke(app, ["bench", str(bert), "--estimate-only", "--length", "8"])
    assert r.exit_code == 0 and "forward_b1_t16: ESTIMATE" in r.stdout, r.output
