"""The foundation commands through typer's CliRunner: results on stdout, errors on stderr, exit codes."""
from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import typer.main
from typer.testing import CliRunner

from apps.main import app

from .conftest import FIXTURES

runner = CliRunner()


def test_embed_text_prints_a_unit_vector_per_text():
    r = runner.invoke(app, ["embed-text", "hello world", "second text", "--device", "cpu"])
    assert r.exit_code == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["text"] for x in lines] == ["hello world", "second text"]
    v = np.array(lines[0]["embedding"])
    assert v.shape == (384,) and abs(np.linalg.norm(v) - 1) < 1e-5


def test_embed_text_from_stdin_to_npy(tmp_path):
    out = tmp_path / "v.npy"
    r = runner.invoke(app, ["embed-text", "-o", str(out), "--device", "cpu"], input="one\ntwo\nthree\n")
    assert r.exit_code == 0, r.stderr
    assert np.load(out).shape == (3, 384) and r.stdout == ""
    assert "wrote 3x384" in r.stderr


def test_embed_text_errors_are_typed_and_on_stderr(tmp_path, no_npu):
    r = runner.invoke(app, ["embed-text", "x", "--device", "npu"])
    assert r.exit_code == 3 and "NPU" in r.stderr and r.stdout == ""
    r = runner.invoke(app, ["embed-text", "x", "--model", "nobody/nothing", "--device", "cpu"])
    assert r.exit_code == 4 and "fix:" in r.stderr
    r = runner.invoke(app, ["embed-text", "--file", str(tmp_path / "missing.txt"), "--device", "cpu"])
    assert r.exit_code == 1 and "cannot read" in r.stderr
    r = runner.invoke(app, ["embed-text", "x", "--device", "gpu"])
    assert r.exit_code == 2 and "unknown device" in r.stderr


def test_doctor_reports_missing_npu_with_fixes_and_fails(no_npu):
    r = runner.invoke(app, ["doctor", "--json"])
    assert r.exit_code == 3
    report = json.loads(r.stdout)
    assert report["npu_usable"] is False
    failing = [c for c in report["checks"] if c["status"] == "fail"]
    assert failing and all(c["fix"] for c in failing)
    assert [c["name"] for c in report["checks"]][:3] == ["NPU PCI function", "amdxdna driver", "device node"]


def test_info_json_lists_backends_and_models(no_npu):
    r = runner.invoke(app, ["info", "--json"])
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["backends"]["cpu"]["available"] is True
    assert info["backends"]["npu"]["available"] is False and info["backends"]["npu"]["why"]
    assert info["models"]["all-MiniLM-L6-v2"]["origin"] == "package"
    assert info["backends"]["cpu"]["engine"] == f"onnxruntime {importlib.metadata.version('onnxruntime')}"


def test_help_and_info_do_not_load_onnxruntime():
    code = ("import sys; from typer.testing import CliRunner; from apps.main import app; "
            "assert CliRunner().invoke(app, ['info']).exit_code == 0; "
            "assert CliRunner().invoke(app, ['--help']).exit_code == 0; "
            "bad = [m for m in ('onnxruntime', 'onnx') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


def test_embed_text_stdin_or_arguments_that_are_not_utf8_are_input_errors():
    r = runner.invoke(app, ["embed-text", "--device", "cpu"], input=b"\xff\xfe bad\n")
    assert r.exit_code == 1 and "line 1 of stdin is not UTF-8" in r.stderr and "fix:" in r.stderr and r.stdout == ""
    r = runner.invoke(app, ["embed-text", "\udcff", "--device", "cpu"])  # how a non-UTF-8 argv byte arrives
    assert r.exit_code == 1 and "not valid UTF-8" in r.stderr


def _no_model(monkeypatch):
    def load(*args, **kwargs):
        raise AssertionError("the model was loaded although the input could be refused first")
    monkeypatch.setattr("pipelines.text.TextEmbedder", load)


def test_embed_text_refuses_a_bad_output_path_before_loading_the_model(tmp_path, monkeypatch):
    _no_model(monkeypatch)
    (tmp_path / "folder.npy").mkdir()
    (tmp_path / "a-file").write_text("")
    for output, says in (("a-file/out.npy", "is not a folder"), ("out.txt", "must end in .npy"),
                         ("folder.npy", "is a folder"), ("a-file/sub/out.npy", "cannot create the folder")):
        r = runner.invoke(app, ["embed-text", "x", "-o", str(tmp_path / output), "--device", "cpu"])
        assert r.exit_code == 2 and says in r.stderr and "fix:" in r.stderr, (output, r.stderr)


def test_embed_text_write_failure_is_a_typed_error(tmp_path):
    out = tmp_path / "out.npy"
    out.symlink_to(tmp_path / "gone" / "out.npy")  # passes the checks up front, fails when written
    r = runner.invoke(app, ["embed-text", "x", "-o", str(out), "--device", "cpu"])
    assert r.exit_code == 1 and f"cannot write {out}" in r.stderr and "fix:" in r.stderr
    assert isinstance(r.exception, SystemExit)  # typer.Exit, not a traceback


def test_embed_text_with_nothing_to_embed_fails_like_embed(tmp_path, monkeypatch):
    _no_model(monkeypatch)
    (tmp_path / "blank.txt").write_text("  \n\n")
    (tmp_path / "empty.txt").write_text("")
    for args in ([], ["--file", str(tmp_path / "blank.txt")], ["--file", str(tmp_path / "empty.txt")]):
        r = runner.invoke(app, ["embed-text", *args, "--device", "cpu"], input="")
        assert r.exit_code == 1 and "no texts to embed" in r.stderr and r.stdout == "", (args, r.stderr)


def test_info_gives_a_hint_for_every_model_not_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("AIE_APPS_HOME", str(tmp_path))  # empty caches: only the packaged models are found
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    r = runner.invoke(app, ["info"])
    assert r.exit_code == 0, r.stderr
    missing = [line for line in r.stdout.splitlines() if line.startswith("model ") and "not installed" in line]
    assert any("esm2_" in line for line in missing)  # no package ships ESM-2
    for line in missing:
        assert "()" not in line and ("pip install" in line or "aie-apps models pull" in line), line


def test_bench_refuses_zero_length_or_runs_and_its_device_help_is_true():
    for option in ("--length", "--runs"):
        r = runner.invoke(app, ["bench", str(FIXTURES / "esm"), "--device", "cpu", option, "0"])
        assert r.exit_code == 2 and option in r.stderr, r.output
    device = next(p for p in typer.main.get_command(app).commands["bench"].params if p.name == "device")
    assert device.default == "emu" and "or auto" not in device.help


def test_version_and_help_pages_show_flags_as_flags():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.startswith("aie-apps ")
    commands = typer.main.get_command(app).commands
    assert len(commands) >= 9
    for name in commands:
        r = runner.invoke(app, [name, "--help"])
        assert r.exit_code == 0, (name, r.stderr)
        assert "<bool>" not in r.stdout, (name, r.stdout)    # `--json`, never `--json <bool>`


# The flags every command shares, and what each means: one vocabulary (clig.dev; what ffmpeg / whisper.cpp users
# expect). -o is always an output path, -f always --format, --json always machine-readable output.
SHARED = {"-o": "--output", "-f": "--format", "-k": "--top-k"}


def _options(command: str) -> dict[str, list[str]]:
    """Each option of a command's --help page: its names (short and long)."""
    import re
    page = runner.invoke(app, [command, "--help"]).stdout
    found = {}
    for line in page.splitlines():
        m = re.match(r"^\s{2}((?:-\w, )?--[\w-]+(?:/--[\w-]+)?)", line)
        if m:
            names = re.findall(r"--?[\w-]+", m.group(1))
            found[names[-1] if len(names) == 1 else next(n for n in names if n.startswith("--"))] = names
    return found


def test_shared_flags_mean_the_same_in_every_command():
    commands = typer.main.get_command(app).commands
    shorts: dict[str, set[str]] = {}
    for name in commands:
        for long, names in _options(name).items():
            for short in (n for n in names if not n.startswith("--")):
                shorts.setdefault(short, set()).add(long)
        help_page = runner.invoke(app, [name, "--help"]).stdout
        assert "--output-dir" not in help_page and "--jsonl" not in help_page, name   # old spellings: hidden
    for short, longs in shorts.items():
        assert len(longs) == 1, f"{short} means {sorted(longs)}"                # no short flag means two things
        if short in SHARED:
            assert longs == {SHARED[short]}, (short, longs)
    for name in ("transcribe", "dictate", "classify", "embed", "embed-text", "bench"):
        opts = _options(name)
        assert "--device" in opts and opts["--device"] == ["--device"], name
        if "--output" in opts:
            assert opts["--output"] == ["-o", "--output"], (name, opts["--output"])
    for name in ("transcribe", "dictate", "classify", "bench", "info", "doctor"):
        assert "--json" in _options(name), name
    assert "--input-device" in _options("dictate") and "-d" not in shorts
    assert all("--max-input-size" in _options(name) for name in ("embed", "embed-text"))  # one name per input limit
