"""BERT family: parity with transformers (committed TINY fixture everywhere, real MiniLM live), padding
invariance, and the typed errors a bad checkpoint gives."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from sdk import hub
from sdk.errors import WeightError
from sdk.models import bert
from sdk.session import Session

from .conftest import FIXTURES

TINY_DIR = FIXTURES / "bert"


def run_bert(folder, ids, token_types, mask):
    cfg, weights = bert.load(folder)
    graph = bert.graph(cfg, *ids.shape)
    with Session([graph], weights, device="cpu") as s:
        return s.run(ids=ids, token_types=token_types, mask=mask)["hidden"]


def test_tiny_matches_transformers_fixture(record_parity):
    g = np.load(TINY_DIR / "golden.npz")
    hidden = run_bert(TINY_DIR, g["ids"], g["token_types"], g["mask"])
    real = g["mask"].astype(bool)  # padded positions are not compared: they are never used
    max_abs, _ = record_parity("bert.tiny", hidden[real], g["hidden"][real])
    assert max_abs <= 1e-5


def test_tiny_config_matches_fixture():
    assert bert.Config.from_dict(json.loads((TINY_DIR / "config.json").read_text())) == bert.TINY


@pytest.mark.reference
def test_minilm_matches_transformers_live(record_parity):
    import torch
    import transformers
    from tokenizers import Tokenizer

    folder = hub.resolve("all-MiniLM-L6-v2").path
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    ids = np.array([tok.encode("The quick brown fox jumps over the lazy dog, twice!").ids], np.int32)
    ours = run_bert(folder, ids, np.zeros_like(ids), np.ones(ids.shape, np.float32))
    model = transformers.BertModel.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        ref = model(torch.tensor(ids, dtype=torch.long)).last_hidden_state.numpy()
    max_abs, _ = record_parity("bert.minilm", ours, ref)
    assert max_abs <= 1e-5


def test_truncated_checkpoint_is_a_typed_error(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(TINY_DIR, folder)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightError, match="truncated"):
        bert.load(folder)


def test_garbage_checkpoint_is_a_typed_error(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(TINY_DIR, folder)
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(WeightError, match="header"):
        bert.load(folder)


def test_wrong_config_lists_misshaped_keys(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(TINY_DIR, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["intermediate_size"] = 40
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightError) as e:
        bert.load(folder)
    assert any("intermediate.dense.weight" in m for m in e.value.misshaped)
    assert not e.value.missing


def test_missing_and_unused_keys_are_listed(tmp_path):
    from safetensors.numpy import save_file

    from sdk.weights import read_safetensors
    folder = tmp_path / "m"
    shutil.copytree(TINY_DIR, folder)
    tensors = read_safetensors(folder / "model.safetensors")
    tensors["encoder.layer.0.output.dense.weights"] = tensors.pop("encoder.layer.0.output.dense.weight")
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(WeightError) as e:
        bert.load(folder)
    assert e.value.missing == ["encoder.layer.0.output.dense.weight"]
    assert e.value.unused == ["encoder.layer.0.output.dense.weights"]
