"""The foundation commands through typer's CliRunner: results on stdout, errors on stderr, exit codes."""
from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from apps.main import app

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
    r = runner.invoke(app, ["embed-text", "-o", str(out), "--device", "cpu"], input="one\n\ntwo\nthree\n")
    assert r.exit_code == 0, r.stderr
    assert np.load(out).shape == (3, 384) and r.stdout == ""
    assert "wrote 3x384" in r.stderr


def test_embed_text_errors_are_typed_and_on_stderr(tmp_path):
    r = runner.invoke(app, ["embed-text", "x", "--device", "npu"])
    assert r.exit_code == 3 and "NPU" in r.stderr and r.stdout == ""
    r = runner.invoke(app, ["embed-text", "x", "--model", "nobody/nothing", "--device", "cpu"])
    assert r.exit_code == 4 and "fix:" in r.stderr
    r = runner.invoke(app, ["embed-text", "--file", str(tmp_path / "missing.txt"), "--device", "cpu"])
    assert r.exit_code == 1 and "cannot read" in r.stderr
    r = runner.invoke(app, ["embed-text", "x", "--device", "gpu"])
    assert r.exit_code == 2 and "unknown device" in r.stderr


def test_doctor_reports_missing_npu_with_fixes_and_fails():
    r = runner.invoke(app, ["doctor", "--json"])
    assert r.exit_code == 3
    report = json.loads(r.stdout)
    assert report["npu_usable"] is False
    failing = [c for c in report["checks"] if c["status"] == "fail"]
    assert failing and all(c["fix"] for c in failing)
    assert [c["name"] for c in report["checks"]][:3] == ["NPU PCI function", "amdxdna driver", "device node"]


def test_info_json_lists_backends_and_models():
    r = runner.invoke(app, ["info", "--json"])
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["backends"]["cpu"]["available"] is True
    assert info["backends"]["npu"]["available"] is False and info["backends"]["npu"]["why"]
    assert info["models"]["all-MiniLM-L6-v2"]["origin"] == "package"
