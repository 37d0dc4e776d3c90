"""Conformer ASR (Parakeet CTC/TDT, GigaAM CTC/RNN-T): encoder and head parity against committed transformers /
gigaam goldens and live, front-end parity, greedy decoding, and long audio through overlapping windows."""
from __future__ import annotations

import importlib.util
import json
import shutil

import numpy as np
import pytest

from pipelines import audio
from pipelines.conformer_asr import (ConformerOptions, ConformerRecognizer, TransducerDecoder, Vocabulary, ctc_greedy,
                                     sentencepiece_pieces)
from sdk.errors import InputError, UsageError, WeightError
from sdk.models import conformer, module_for
from sdk.session import Session

from .conftest import FIXTURES

DIR = FIXTURES / "conformer"
NAMES = ["parakeet_ctc", "parakeet_tdt", "gigaam_ctc", "gigaam_rnnt"]


def _generator():
    spec = importlib.util.spec_from_file_location("make_conformer", FIXTURES / "make_conformer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_encoder(cfg, weights, features, bucket):
    """Our encoder on features [T, mels] padded to `bucket` frames; the valid frames of every output."""
    padded = np.zeros((1, bucket, cfg.num_mel_bins), np.float32)
    padded[0, :len(features)] = features
    lengths = cfg.output_length(len(features))
    with Session([conformer.encoder_graph(cfg, bucket)], weights, device="cpu") as s:
        out = s.run(features=padded, **{f"length{i}": np.int32(n) for i, n in enumerate(lengths)})
    return {k: v[:, :lengths[-1]] for k, v in out.items()}


def _transducer_tokens(cfg, weights, projected):
    with Session(conformer.decoder_graphs(cfg), weights, device="cpu") as s:
        return [t for t, _ in TransducerDecoder(s, cfg)(projected)]


def _collapse(log_probs, blank):
    return [t for t, _ in ctc_greedy(log_probs, blank)]


@pytest.mark.parametrize("name", NAMES)
def test_parity_with_committed_goldens(name, record_parity):
    """Encoder output (rel-L2 <= 1e-5) and greedy tokens equal transformers' / gigaam's, at a padded bucket."""
    folder = DIR / name
    cfg, weights = conformer.load(folder)
    assert module_for(cfg.model_type) is conformer
    golden = np.load(folder / "golden.npz")
    features = golden["features"][0]
    features = features.T if cfg.model_type == "gigaam" else features  # gigaam takes [mels, T]
    out = _run_encoder(cfg, weights, features, bucket=len(features) + 29)
    _, rel = record_parity(f"{name}.encoder", out["hidden"], golden["ref_hidden"])
    assert rel <= 1e-5
    if cfg.head == "ctc":
        _, rel = record_parity(f"{name}.log_probs", out["log_probs"], golden["ref_log_probs"])
        assert rel <= 1e-5
        ours, ref = _collapse(out["log_probs"][0], cfg.blank_id), _collapse(golden["ref_log_probs"][0], cfg.blank_id)
    else:
        ours, ref = _transducer_tokens(cfg, weights, out["projected"][0]), list(golden["ref_tokens"])
    assert ours == ref and len(ref) > 0


@pytest.mark.parametrize("attention", ["rel_pos", "rotary"])
def test_tiny_output_does_not_depend_on_bucket_or_padding(attention):
    """Valid frames are the same in a tight and a loose bucket, whatever the padding holds."""
    from dataclasses import replace
    cfg = replace(conformer.TINY, attention=attention)
    rng = np.random.default_rng(0)
    weights = {k: (rng.standard_normal(shape) * 0.3).astype(np.float32) for k, shape in conformer.param_shapes(cfg).items()}
    features = rng.standard_normal((45, cfg.num_mel_bins)).astype(np.float32)
    tight = _run_encoder(cfg, weights, features, bucket=45)
    lengths = cfg.output_length(45)
    garbage = rng.standard_normal((1, 80, cfg.num_mel_bins)).astype(np.float32) * 10
    garbage[0, :45] = features
    with Session([conformer.encoder_graph(cfg, 80)], weights, device="cpu") as s:
        loose = s.run(features=garbage, **{f"length{i}": np.int32(n) for i, n in enumerate(lengths)})
    assert tight["hidden"].shape[1] == lengths[-1] == 6
    np.testing.assert_allclose(loose["hidden"][:, :lengths[-1]], tight["hidden"], atol=2e-5)


@pytest.mark.parametrize("name", ["parakeet_ctc", "parakeet_tdt"])
def test_padding_is_masked_like_transformers(name, record_parity):
    """Row 1 of a transformers batch has 97 valid frames and random padding; our bucketed run of just those
    frames gives the same valid outputs."""
    cfg, weights = conformer.load(DIR / name)
    golden = np.load(DIR / name / "golden.npz")
    n = int(golden["batch_mask"][1].sum())
    out = _run_encoder(cfg, weights, golden["batch"][1, :n], bucket=160)
    _, rel = record_parity(f"{name}.padded", out["hidden"][0], golden["batch_hidden"][1, :out["hidden"].shape[1]])
    assert rel <= 1e-5


def test_wrong_checkpoints_are_refused(tmp_path):
    with pytest.raises(UsageError):
        conformer.Config.from_dict({"model_type": "bert"})
    shutil.copy(DIR / "gigaam_ctc" / "config.json", tmp_path / "config.json")  # a GigaAM config with Parakeet weights
    shutil.copy(DIR / "parakeet_ctc" / "model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(WeightError) as e:
        conformer.load(tmp_path)
    assert e.value.missing and e.value.unused


def test_sharded_checkpoint_loads(tmp_path):
    from safetensors.numpy import save_file
    ckpt = conformer.read_safetensors(DIR / "parakeet_ctc" / "model.safetensors")
    names = sorted(ckpt)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        save_file({k: ckpt[k] for k in keys}, str(tmp_path / file))
    index = {"weight_map": {k: file for file, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    shutil.copy(DIR / "parakeet_ctc" / "config.json", tmp_path / "config.json")
    _, sharded = conformer.load(tmp_path)
    _, single = conformer.load(DIR / "parakeet_ctc")
    assert sharded.keys() == single.keys() and all(np.array_equal(sharded[k], single[k]) for k in single)


@pytest.mark.parametrize("name", ["parakeet_ctc", "gigaam_rnnt"])
def test_encoder_on_emulator(name, record_parity):
    """The same encoder graph on the functional NPU emulator (emulated, bf16 numerics): all ops on the NPU."""
    cfg, weights = conformer.load(DIR / name)
    golden = np.load(DIR / name / "golden.npz")
    features = golden["features"][0].T if cfg.model_type == "gigaam" else golden["features"][0]
    lengths = cfg.output_length(len(features))
    with Session([conformer.encoder_graph(cfg, len(features))], weights, device="emu") as s:
        out = s.run(features=features[None], **{f"length{i}": np.int32(n) for i, n in enumerate(lengths)})
        assert s.report()["npu_fraction"]["ops"] == 1.0
    _, rel = record_parity(f"{name}.encoder.emu", out["hidden"], golden["ref_hidden"])
    assert rel <= 2e-2


def test_front_ends_match_references(record_parity):
    golden = np.load(DIR / "frontends.npz")
    max_abs, _ = record_parity("nemo_log_mel", audio.nemo_log_mel(golden["samples"]), golden["nemo"])
    assert max_abs <= 1e-4
    max_abs, _ = record_parity("gigaam_log_mel", audio.gigaam_log_mel(golden["samples"]), golden["gigaam"])
    assert max_abs <= 1e-4


def test_stream_gives_the_tokens_of_transcribe():
    """Live audio in uneven chunks: the final tokens, concatenated, are exactly transcribe()'s, whatever the
    chunking (a window is decoded only once audio beyond it has arrived)."""
    rec = ConformerRecognizer(DIR / "parakeet_tdt", device="cpu",
                              options=ConformerOptions(window_seconds=2.0, overlap_seconds=0.5, buckets_seconds=(1.0,)))
    samples = (np.random.default_rng(4).standard_normal(int(5.3 * 16000)) * 0.1).astype(np.float32)
    reference = rec.transcribe_tokens(samples)
    stream, got, rng, i = rec.stream(), [], np.random.default_rng(5), 0
    while i < len(samples):
        n = int(rng.integers(100, 9000))
        got += stream.feed(samples[i:i + n])
        i += n
    got += stream.flush()
    assert got == reference and len(reference) > 10
    assert [f for _, f in got] == sorted(f for _, f in got)
    with pytest.raises(InputError):
        stream.feed(np.zeros((100, 2), np.float32))


def test_chunked_windows_equal_one_pass_when_encoder_is_local(tmp_path):
    """With attention outputs zeroed, GigaAM's encoder only sees +-0.25 s; windowed decoding of 10 s must then
    give exactly the tokens (and frames) of one pass over the whole clip: none duplicated, none lost."""
    from safetensors.numpy import save_file
    src = DIR / "gigaam_ctc"
    ckpt = {k: v.copy() for k, v in conformer.read_safetensors(src / "model.safetensors").items()}
    for k in ckpt:
        if ".self_attn.linear_out." in k:
            ckpt[k][:] = 0
    save_file(ckpt, str(tmp_path / "model.safetensors"))
    shutil.copy(src / "config.json", tmp_path / "config.json")
    t = np.arange(10 * 16000) / 16000
    rng = np.random.default_rng(3)
    samples = (0.3 * np.sin(2 * np.pi * (300 + 200 * np.sin(t)) * t) * (rng.random(len(t)) > 0.3)).astype(np.float32)
    whole = ConformerRecognizer(tmp_path, device="cpu", options=ConformerOptions(window_seconds=10.5, buckets_seconds=()))
    chunked = ConformerRecognizer(tmp_path, device="cpu",
                                  options=ConformerOptions(window_seconds=3.0, overlap_seconds=1.0, buckets_seconds=(1.5,)))
    reference = whole.window_tokens(samples)
    joined = chunked.transcribe_tokens(samples)
    assert len(reference) > 20
    assert joined == reference
    # and the windows really disagree near their edges, so the join had work to do
    first = chunked.window_tokens(samples[:3 * 16000])
    assert first != [p for p in reference if p[1] < 75]


def test_recognizer_segments_and_limits():
    rec = ConformerRecognizer(DIR / "parakeet_ctc", device="cpu",
                              options=ConformerOptions(window_seconds=3.0, overlap_seconds=1.0, buckets_seconds=(1.0,)))
    samples = (np.random.default_rng(0).standard_normal(32000) * 0.1).astype(np.float32)
    segments = rec.decode_window(samples, offset=5.0)
    assert segments and all(5.0 <= s.start < s.end <= 7.1 and s.text for s in segments)
    tokens = rec.window_tokens(samples)
    assert " ".join(s.text for s in segments).replace(" ", "") == \
        rec.vocabulary.decode([t for t, _ in tokens]).replace(" ", "")
    with pytest.raises(InputError):
        rec.decode_window(np.zeros(4 * 16000, np.float32))
    assert rec.decode_window(np.zeros(100, np.float32)) == []
    assert rec.decode_window(np.full(16000, 1e-5, np.float32)) == []  # silence is not decoded
    assert rec.report()["device_effective"] == "cpu"


def test_recognizer_takes_only_finite_float_mono_audio():
    rec = ConformerRecognizer(DIR / "parakeet_ctc", device="cpu")
    noise = (np.random.default_rng(0).standard_normal(16000) * 0.1).astype(np.float32)
    for bad in (noise.astype(np.complex64), "talk.wav"):
        with pytest.raises(InputError, match="has dtype"):
            rec.transcribe(bad)
    with pytest.raises(InputError, match="expected mono 16 kHz samples"):
        rec.transcribe(noise[:, None])
    for bad in (np.full(16000, np.nan, np.float32), np.full(16000, np.inf, np.float32)):  # used to give []
        with pytest.raises(InputError, match="NaN or infinite"):
            rec.decode_window(bad)
        with pytest.raises(InputError, match="NaN or infinite"):
            rec.stream().feed(bad)


def test_vocabularies(tmp_path):
    # a SentencePiece ModelProto with three pieces, encoded by hand: field 1 (pieces) { field 1: piece, 2: score }
    def piece(s):
        body = b"\x0a" + bytes([len(s.encode())]) + s.encode() + b"\x15\x00\x00\x80\xbf"
        return b"\x0a" + bytes([len(body)]) + body
    data = piece("<unk>") + piece("\u2581hello") + piece("\u2581wor") + piece("ld") + b"\x12\x02\x08\x01"
    assert sentencepiece_pieces(data) == ["<unk>", "\u2581hello", "\u2581wor", "ld"]
    (tmp_path / "tokenizer.model").write_bytes(data)
    assert Vocabulary.from_folder(tmp_path, {}).decode([1, 2, 3]) == "hello world"
    chars = Vocabulary.from_folder(DIR / "gigaam_ctc", json.loads((DIR / "gigaam_ctc" / "config.json").read_text()))
    assert chars.decode([1, 0, 2]) == "а б"
    assert Vocabulary.from_folder(DIR / "parakeet_ctc", {}).decode([27, 0, 1, 2]) == "' ab"
    with pytest.raises(WeightError):
        Vocabulary.from_folder(tmp_path / "missing", {})


# ---- live references (need torch + transformers / gigaam) ---------------------------------------------------

@pytest.mark.reference
@pytest.mark.parametrize("kind", ["ctc", "tdt", "rnnt"])
def test_parakeet_live(kind, tmp_path, record_parity):
    gen = _generator()
    model = gen.parakeet_model(kind, seed=7)
    model.save_pretrained(tmp_path, safe_serialization=True)
    cfg, weights = conformer.load(tmp_path)
    frames = 211 if kind == "ctc" else 101  # transformers' transducer generate is slow: fewer frames
    features = np.random.default_rng(7).standard_normal((1, frames, 80)).astype(np.float32)
    ref = gen.parakeet_outputs(model, features)
    out = _run_encoder(cfg, weights, features[0], bucket=frames + 45)
    _, rel = record_parity(f"parakeet_{kind}.live.encoder", out["hidden"], ref["hidden"])
    assert rel <= 1e-5
    if kind == "ctc":
        assert _collapse(out["log_probs"][0], cfg.blank_id) == _collapse(ref["log_probs"][0], cfg.blank_id)
    else:
        assert _transducer_tokens(cfg, weights, out["projected"][0]) == list(ref["tokens"]) and len(ref["tokens"])


@pytest.mark.reference
@pytest.mark.skipif(importlib.util.find_spec("gigaam") is None,
                    reason="needs the gigaam reference: pip install --no-deps gigaam==0.1.0")
@pytest.mark.parametrize("head", ["ctc", "rnnt"])
@pytest.mark.parametrize("attention", ["rotary", "rel_pos"])
def test_gigaam_live(head, attention, tmp_path, record_parity):
    from safetensors.torch import save_file
    gen = _generator()
    cfg_dict, model = gen.gigaam_model(head, attention, seed=11)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg_dict))
    cfg, weights = conformer.load(tmp_path)
    frames = 190 if head == "ctc" else 110
    features = (np.random.default_rng(11).standard_normal((1, 64, frames)) * 2 - 8).astype(np.float32)
    ref = gen.gigaam_outputs(cfg_dict, model, features)
    out = _run_encoder(cfg, weights, features[0].T, bucket=frames + 40)
    _, rel = record_parity(f"gigaam_{head}_{attention}.live.encoder", out["hidden"], ref["hidden"])
    assert rel <= 1e-5
    if head == "ctc":
        _, rel = record_parity(f"gigaam_{head}_{attention}.live.log_probs", out["log_probs"], ref["log_probs"])
        assert rel <= 1e-5
    else:
        assert _transducer_tokens(cfg, weights, out["projected"][0]) == list(ref["tokens"]) and len(ref["tokens"])


@pytest.mark.reference
def test_front_ends_live(record_parity):
    gen = _generator()
    samples = (np.random.default_rng(5).standard_normal(16000 * 3 + 77) * 0.2).astype(np.float32)
    max_abs, _ = record_parity("nemo_log_mel.live", audio.nemo_log_mel(samples), gen.nemo_reference(samples))
    assert max_abs <= 1e-4
    max_abs, _ = record_parity("gigaam_log_mel.live", audio.gigaam_log_mel(samples, n_mels=64),
                               gen.gigaam_reference(samples))
    assert max_abs <= 1e-4
