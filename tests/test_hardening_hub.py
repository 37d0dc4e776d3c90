"""Issue #26 item 16: an interrupted download is not a model, a FIFO or device is named as what it is, and
bench reads the architecture from config.json instead of guessing Whisper from any model.bin."""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from apps.main import app
from sdk import hub
from sdk.errors import ModelNotFound
from sdk.settings import load

from .conftest import FIXTURES


def _settings(tmp_path, offline=True):
    return replace(load({"XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path)}), offline=offline)


def test_a_download_cut_off_after_config_json_is_not_a_complete_model(tmp_path):
    s = _settings(tmp_path)
    ours = s.models_dir / "org--partial"
    ours.mkdir(parents=True)
    (ours / "config.json").write_text("{}")
    with pytest.raises(ModelNotFound, match=r"incomplete \(missing model.safetensors, tokenizer.json\)") as e:
        hub.resolve("org/partial", settings=s)
    assert "go online" in e.value.fix
    for name in ("model.safetensors", "tokenizer.json"):
        (ours / name).write_bytes(b"x")
    assert hub.resolve("org/partial", settings=s).origin == "cache"


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "file"])
def test_a_model_path_that_is_not_a_folder_is_named_as_such(tmp_path, special):
    path = "/dev/zero"
    if special == "fifo":
        path = str(tmp_path / "pipe")
        os.mkfifo(path)
    elif special == "file":
        path = str(tmp_path / "model.safetensors")
        shutil.copy(FIXTURES / "bert" / "model.safetensors", path)
    with pytest.raises(ModelNotFound, match="is (a file|not a folder)") as e:
        hub.resolve(path, settings=_settings(tmp_path))
    assert "does not exist" not in str(e.value)


def test_bench_does_not_take_a_bert_folder_with_a_model_bin_for_whisper(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(FIXTURES / "bert", folder)
    (folder / "model.bin").write_bytes(b"not ctranslate2")
    r = CliRunner().invoke(app, ["bench", str(folder), "--json", "--length", "16"])
    assert r.exit_code == 0 and json.loads(r.stdout), r.output  # benchmarked as the BERT its config names
    r = CliRunner().invoke(app, ["bench", str(folder)])  # the default --length 128 > its 64 positions
    assert r.exit_code == 2 and "longer than embed-text runs (64 tokens)" in r.stderr
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "config.json").write_text("{}")
    (junk / "model.bin").write_bytes(b"\0" * 64)
    r = CliRunner().invoke(app, ["bench", str(junk)])
    assert r.exit_code == 1 and "model.bin" in r.stderr and "fix:" in r.stderr
