"""ESM-2: parity of every layer's hidden states with transformers (committed goldens, and live when torch is
installed), padding invariance, fair-esm layer selection, configs and checkpoint loading."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from sdk.errors import UsageError, WeightError
from sdk.models import esm, module_for
from sdk.session import Session

from .conftest import FIXTURES

FIXTURE = FIXTURES / "esm"


def _run(cfg, weights, ids, mask, layers):
    with Session([esm.graph(cfg, *ids.shape, layers=layers)], weights, device="cpu") as s:
        return s.run(ids=ids, mask=mask)


def test_registered_as_esm():
    assert module_for("esm") is esm


def test_every_layer_matches_transformers_golden(record_parity):
    """A batch of 4 proteins of lengths 48, 20 (with a <mask>: token dropout), 16 and 20, padded to 50."""
    cfg, weights = esm.load(FIXTURE)
    golden = np.load(FIXTURE / "golden.npz")
    ids, mask, hidden = golden["ids"], golden["mask"], golden["hidden"]
    assert len(set(mask.sum(1).tolist())) >= 3 and (ids == cfg.mask_token_id).any()
    out = _run(cfg, weights, ids, mask, range(cfg.num_hidden_layers + 1))
    valid = mask[..., None] > 0  # positions the reference defines; padded rows are masked out downstream
    for k in range(cfg.num_hidden_layers + 1):
        max_abs, _ = record_parity(f"esm.layer_{k}", np.where(valid, out[f"layer_{k}"], 0), np.where(valid, hidden[k], 0))
        assert max_abs <= 1e-4


def test_padding_never_changes_a_sequence():
    """The same protein alone (no padding) and padded in a longer batch gives the same hidden states."""
    cfg, weights = esm.load(FIXTURE)
    golden = np.load(FIXTURE / "golden.npz")
    row = 2  # 16 residues, padded to 50 in the golden batch
    n = int(golden["mask"][row].sum())
    alone = _run(cfg, weights, golden["ids"][row:row + 1, :n], np.ones((1, n), np.float32), (-1, 0, 2))
    batched = _run(cfg, weights, golden["ids"], golden["mask"], (-1, 0, 2))
    for k in ("layer_0", "layer_2", f"layer_{cfg.num_hidden_layers}"):
        np.testing.assert_allclose(batched[k][row, :n], alone[k][0], atol=1e-5, rtol=0)
    # and the pad token ids themselves do not matter either
    ids = golden["ids"].copy()
    ids[golden["mask"] == 0] = 7
    other = _run(cfg, weights, ids, golden["mask"], (-1,))
    valid = golden["mask"] > 0
    np.testing.assert_allclose(other["layer_3"][valid], batched["layer_3"][valid], atol=1e-6, rtol=0)


def test_layers_follow_fair_esm_semantics():
    assert esm.resolve_layers([-1], 6) == (6,)
    assert esm.resolve_layers([0, -7, 3, -1, 6], 6) == (0, 3, 6)
    for bad in (7, -8):
        with pytest.raises(UsageError, match="does not exist"):
            esm.resolve_layers([bad], 6)
    g = esm.graph(esm.TINY, 1, 8, layers=(-1, 1))
    assert sorted(g.outputs) == ["layer_1", f"layer_{esm.TINY.num_hidden_layers}"]


def test_config_from_a_real_esm2_config_json():
    # the keys of facebook/esm2_t33_650M_UR50D/config.json (unknown keys are ignored)
    raw = {"architectures": ["EsmForMaskedLM"], "attention_probs_dropout_prob": 0.0, "classifier_dropout": None,
           "emb_layer_norm_before": False, "esmfold_config": None, "hidden_act": "gelu",
           "hidden_dropout_prob": 0.0, "hidden_size": 1280, "initializer_range": 0.02,
           "intermediate_size": 5120, "is_folding_model": False, "layer_norm_eps": 1e-05, "mask_token_id": 32,
           "max_position_embeddings": 1026, "model_type": "esm", "num_attention_heads": 20,
           "num_hidden_layers": 33, "pad_token_id": 1, "position_embedding_type": "rotary",
           "token_dropout": True, "torch_dtype": "float32", "transformers_version": "4.25.0.dev0",
           "use_cache": True, "vocab_list": None, "vocab_size": 33}
    assert esm.Config.from_dict(raw) == esm.PRESETS["esm2_t33_650M_UR50D"]
    with pytest.raises(UsageError, match="rotary"):
        esm.Config.from_dict(raw | {"position_embedding_type": "absolute"})


@pytest.mark.parametrize("name,nominal", [("esm2_t6_8M_UR50D", 8e6), ("esm2_t12_35M_UR50D", 35e6),
                                          ("esm2_t30_150M_UR50D", 150e6), ("esm2_t33_650M_UR50D", 650e6),
                                          ("esm2_t36_3B_UR50D", 3e9)])
def test_presets_have_their_published_sizes(name, nominal):
    cfg = esm.PRESETS[name]
    count = sum(int(np.prod(s)) for s in esm.param_shapes(cfg).values())
    assert 0.9 * nominal < count < 1.05 * nominal
    assert f"_t{cfg.num_hidden_layers}_" in name


def test_checkpoint_problems_are_named(tmp_path):
    from safetensors.numpy import load_file, save_file
    folder = tmp_path / "broken"
    shutil.copytree(FIXTURE, folder)
    tensors = load_file(folder / "model.safetensors")
    del tensors["esm.encoder.layer.1.intermediate.dense.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(WeightError, match="intermediate.dense.weight"):
        esm.load(folder)
    config = json.loads((FIXTURE / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"rope_theta": 500.0}))
    shutil.copy(FIXTURE / "model.safetensors", folder / "model.safetensors")
    with pytest.raises(WeightError, match="rotary"):
        esm.load(folder)


def test_loads_the_layout_of_the_published_checkpoints(tmp_path):
    """facebook/esm2_* safetensors: LayerNorm.weight names, per-layer rotary inv_freq, an unused learned position
    table (1026 + 2 rows), position_ids, lm_head with its decoder, contact head. All but the encoder is ignored."""
    from safetensors.numpy import load_file, save_file
    cfg, ours = esm.load(FIXTURE)
    tensors = {k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias"): v
               for k, v in load_file(FIXTURE / "model.safetensors").items() if "rotary" not in k}
    inv_freq = esm.inverse_frequencies(cfg)
    tensors |= {f"esm.encoder.layer.{i}.attention.self.rotary_embeddings.inv_freq": inv_freq
                for i in range(cfg.num_hidden_layers)}
    tensors |= {"esm.embeddings.position_embeddings.weight": np.zeros((1028, cfg.hidden_size), np.float32),
                "esm.embeddings.position_ids": np.arange(1026, dtype=np.int64)[None],
                "lm_head.decoder.weight": tensors["esm.embeddings.word_embeddings.weight"]}
    save_file(tensors, tmp_path / "model.safetensors")
    shutil.copy(FIXTURE / "config.json", tmp_path / "config.json")
    _, weights = esm.load(tmp_path)
    assert weights.keys() == ours.keys() and all(np.array_equal(weights[k], ours[k]) for k in ours)


def test_eager_numpy_forward_equals_the_compiled_graph():
    cfg, weights = esm.load(FIXTURE)
    golden = np.load(FIXTURE / "golden.npz")
    eager = esm.forward(weights, golden["ids"], golden["mask"], cfg=cfg, layers=(1, 3))
    graphed = _run(cfg, weights, golden["ids"], golden["mask"], (1, 3))
    for k in ("layer_1", "layer_3"):
        # the graph runs as one OpenCV network by default: the same math, summed in another order
        np.testing.assert_allclose(eager[k], graphed[k], atol=5e-6, rtol=0)


@pytest.mark.reference
@pytest.mark.parametrize("emb_layer_norm_before", [False, True])
def test_live_against_transformers(tmp_path, record_parity, emb_layer_norm_before):
    """A fresh random EsmModel (no `esm.` prefix, plain weight/bias names) against transformers, live; also with
    the optional layer norm after the embeddings."""
    import torch
    import transformers
    from dataclasses import asdict, replace
    torch.manual_seed(1)
    cfg = replace(esm.TINY, emb_layer_norm_before=emb_layer_norm_before)
    model = transformers.EsmModel(transformers.EsmConfig(**asdict(cfg), hidden_dropout_prob=0.0,
                                                         attention_probs_dropout_prob=0.0)).eval()
    model.save_pretrained(tmp_path)
    ours_cfg, weights = esm.load(tmp_path)
    rng = np.random.default_rng(1)
    lengths = [30, 9, 22]
    ids = np.ones((3, 32), np.int32)
    mask = np.zeros((3, 32), np.float32)
    for b, n in enumerate(lengths):
        ids[b, 0], ids[b, 1:n + 1], ids[b, n + 1] = 0, rng.integers(4, 29, n), 2
        mask[b, :n + 2] = 1
    ids[0, 5] = ids[0, 11] = cfg.mask_token_id
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                    output_hidden_states=True).hidden_states
    out = _run(ours_cfg, weights, ids, mask, range(cfg.num_hidden_layers + 1))
    valid = mask[..., None] > 0
    for k in range(cfg.num_hidden_layers + 1):
        max_abs, _ = record_parity(f"esm.live{'.emb_ln' if emb_layer_norm_before else ''}.layer_{k}", np.where(valid, out[f"layer_{k}"], 0),
                                   np.where(valid, ref[k].numpy(), 0))
        assert max_abs <= 1e-4
