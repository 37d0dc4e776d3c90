"""Whisper: TINY random-init parity (safetensors and CTranslate2), the device-side greedy filter, the CT2
reader's typed errors, and (reference) real tiny.en logits against transformers live."""
from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np
import pytest

from sdk.errors import WeightError
from sdk.models import whisper as W
from sdk.session import Session
from sdk.weights import read_ctranslate2

from .conftest import FIXTURES

FIX = FIXTURES / "whisper"
TS_BEGIN = 60  # a made-up timestamp_begin inside the TINY vocabulary (96)


@pytest.fixture(scope="module")
def golden():
    return dict(np.load(FIX / "golden.npz"))


def _run(folder, golden, prefill=()):
    cfg, weights = W.load(folder)
    s = Session(W.graphs(cfg, timestamp_begin=TS_BEGIN, prefill=prefill), weights, device="cpu")
    state = s.new_state()
    enc = s.run("encode", state, mel=golden["mel"])["encoder"]
    return cfg, weights, s, state, enc


@pytest.mark.parametrize("fmt", ["hf", "ct2"])
def test_tiny_parity(fmt, golden, record_parity):
    _, _, s, state, enc = _run(FIX / fmt, golden)
    assert record_parity(f"whisper-tiny-{fmt}.encoder", enc, golden["encoder"])[0] <= 1e-4
    logits = [s.run("decode_step", state, tokens=np.array([[t]], np.int32), pos=p)["logits"][0, 0]
              for p, t in enumerate(golden["tokens"][0])]
    assert record_parity(f"whisper-tiny-{fmt}.logits", np.stack(logits), golden["logits"][0])[0] <= 1e-4


def test_ct2_weights_equal_safetensors():
    cfg_hf, hf = W.load(FIX / "hf")
    cfg_ct2, ct2 = W.load(FIX / "ct2")
    assert cfg_hf == cfg_ct2 and hf.keys() == ct2.keys()
    for k in hf:
        np.testing.assert_array_equal(hf[k], ct2[k], err_msg=k)


def test_prefill_then_steps(golden, record_parity):
    """decode_3 (three tokens at once) fills the cache exactly as three single steps would."""
    _, _, s, state, _ = _run(FIX / "hf", golden, prefill=(3,))
    toks = golden["tokens"][0]
    first = s.run("decode_3", state, tokens=toks[None, :3].astype(np.int32), pos=0)["logits"][0]
    rest = [s.run("decode_step", state, tokens=np.array([[t]], np.int32), pos=3 + i)["logits"][0, 0]
            for i, t in enumerate(toks[3:])]
    assert record_parity("whisper-tiny.prefill", np.concatenate([first, np.stack(rest)]), golden["logits"][0])[0] <= 1e-4


def _host_filter(logits, bias, lo1, hi1, lo2, hi2):
    allowed = np.zeros_like(logits, bool)
    allowed[lo1:hi1] = allowed[lo2:hi2] = True
    z = np.where(allowed, logits + bias, -np.inf)
    return z - np.logaddexp.reduce(z)


@pytest.mark.parametrize("ranges", [(0, TS_BEGIN, TS_BEGIN, 96), (0, 0, TS_BEGIN, TS_BEGIN + 3),
                                    (2, TS_BEGIN, TS_BEGIN + 10, 96), (0, TS_BEGIN, 0, 0)])
def test_decode_greedy_matches_host_rules(golden, ranges):
    """The device-side filter + argmax gives the token and log-probs the host computes from full logits."""
    cfg, weights, s, state, _ = _run(FIX / "hf", golden)
    rng = np.random.default_rng(1)
    table = np.where(rng.random((2, cfg.vocab_size)) < 0.2, np.float32(-1e30), np.float32(0)).astype(np.float32)
    s.run("set_suppress", state, bias=table)
    ref_state = s.new_state()
    s.run("encode", ref_state, mel=golden["mel"])
    for p, t in enumerate(golden["tokens"][0][:4]):
        first = int(p == 0)
        out = s.run("decode_greedy", state, tokens=np.array([[t]], np.int32), pos=p, first=first,
                    lo1=ranges[0], hi1=ranges[1], lo2=ranges[2], hi2=ranges[3])
        logits = s.run("decode_step", ref_state, tokens=np.array([[t]], np.int32), pos=p)["logits"][0, 0]
        lp = _host_filter(logits, table[first], *ranges)
        assert int(out["token"][0]) == int(np.argmax(lp))
        np.testing.assert_allclose(out["logprob"][0], lp.max(), atol=1e-5)
        ts = lp[TS_BEGIN:]
        if np.isfinite(ts).any():
            total = np.logaddexp.reduce(ts)
            assert int(out["ts_token"][0]) == int(np.argmax(ts))
            np.testing.assert_allclose(out["ts_total"][0], total, atol=1e-5)
            np.testing.assert_allclose(out["ts_logprob"][0], ts.max() - total, atol=1e-5)


def test_short_windows_are_whisper_with_a_shorter_audio_context(golden):
    """A short window's entries compute exactly Whisper with n_audio_ctx = the window (first positional
    embeddings, cross-attention over the window's positions only), even when a full window wrote the state
    before it; and each window's decode_greedy agrees with its decode_step."""
    cfg, weights = W.load(FIX / "hf")
    s = Session(W.graphs(cfg, timestamp_begin=TS_BEGIN, encoder_windows=W.ENCODER_WINDOWS), weights, device="cpu")
    windows = W.windows(cfg, W.ENCODER_WINDOWS)
    assert [w.full for w in windows] == [False] * len(W.ENCODER_WINDOWS) + [True]
    assert len({w.frames for w in windows}) == len(windows) and windows[-1].frames == cfg.n_frames
    state = s.new_state()
    s.run("set_suppress", state, bias=np.zeros((2, cfg.vocab_size), np.float32))
    tokens = golden["tokens"][0][:4]
    for window in windows[:-1]:
        short = replace(cfg, max_source_positions=window.n_audio)
        ref_w = weights | {"model.encoder.embed_positions.weight":
                           weights["model.encoder.embed_positions.weight"][:window.n_audio]}
        ref = Session(W.graphs(short), ref_w, device="cpu")
        ref_state = ref.new_state()
        mel = golden["mel"][:, :, :window.frames]
        s.run("encode", state, mel=golden["mel"])  # the full window's cross K/V, longer than this window's
        np.testing.assert_array_equal(s.run(window.entry("encode"), state, mel=mel)["encoder"],
                                      ref.run("encode", ref_state, mel=mel)["encoder"])
        for p, t in enumerate(tokens):
            step = {"tokens": np.array([[t]], np.int32), "pos": p}
            logits = s.run(window.entry("decode_step"), state, **step)["logits"]
            np.testing.assert_array_equal(logits, ref.run("decode_step", ref_state, **step)["logits"])
        greedy = s.run(window.entry("decode_greedy"), state, tokens=np.array([[tokens[-1]]], np.int32),
                       pos=len(tokens), first=0, lo1=0, hi1=TS_BEGIN, lo2=TS_BEGIN, hi2=cfg.vocab_size)
        step = ref.run("decode_step", ref_state, tokens=np.array([[tokens[-1]]], np.int32), pos=len(tokens))
        assert int(greedy["token"][0]) == int(np.argmax(step["logits"][0, 0]))


def _ct2_file(variables: dict[str, np.ndarray]) -> bytes:
    """A CTranslate2 model.bin (format version 6, no aliases) holding `variables`."""
    codes = {np.dtype(t): code for code, t in enumerate([np.float32, np.int8, np.int16, np.int32, np.float16])}

    def string(s: str) -> bytes:
        return struct.pack("<H", len(s) + 1) + s.encode() + b"\0"
    out = [struct.pack("<I", 6), string("WhisperSpec"), struct.pack("<II", 3, len(variables))]
    for name, a in variables.items():
        out += [string(name), struct.pack(f"<B{a.ndim}I", a.ndim, *a.shape),
                struct.pack("<BI", codes[a.dtype], a.nbytes), a.tobytes()]
    return b"".join(out) + struct.pack("<I", 0)


def test_an_fp16_model_bin_loads_as_its_float32_widening(tmp_path):
    """faster-whisper's model.bin files hold fp16 (the fixture fp32): the reader widens each variable as it reads it."""
    ckpt = read_ctranslate2(FIX / "ct2" / "model.bin")
    (tmp_path / "config.json").write_bytes((FIX / "ct2" / "config.json").read_bytes())
    (tmp_path / "model.bin").write_bytes(_ct2_file(
        {k: a.astype(np.float16) if a.dtype == np.float32 else a for k, a in ckpt.items()}))
    cfg, weights = W.load(tmp_path)
    cfg32, weights32 = W.load(FIX / "ct2")
    assert cfg == cfg32 and weights.keys() == weights32.keys()
    for k, a in weights.items():
        assert a.dtype == np.float32
        np.testing.assert_array_equal(a, weights32[k].astype(np.float16).astype(np.float32), err_msg=k)


def test_ct2_reader_typed_errors(tmp_path):
    data = (FIX / "ct2" / "model.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightError, match="truncated"):
        read_ctranslate2(tmp_path / "cut.bin")
    (tmp_path / "junk.bin").write_bytes(b"RIFF" + bytes(100))
    with pytest.raises(WeightError, match="not a CTranslate2"):
        read_ctranslate2(tmp_path / "junk.bin")
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightError, match="neither"):
        W.load(tmp_path / "empty")


def test_configs_of_the_family():
    """tiny .. large-v3 and turbo configs (shape keys of their config.json) build graphs of the right sizes."""
    large_v3 = W.Config.from_dict({"vocab_size": 51866, "num_mel_bins": 128, "d_model": 1280, "encoder_layers": 32,
                                   "encoder_attention_heads": 20, "decoder_layers": 32, "decoder_attention_heads": 20,
                                   "encoder_ffn_dim": 5120, "decoder_ffn_dim": 5120, "unknown_key": 1})
    turbo = W.Config.from_dict({**large_v3.__dict__, "decoder_layers": 4})
    for cfg, n in ((large_v3, 32), (turbo, 4)):
        shapes = W.param_shapes(cfg)
        assert shapes["model.encoder.conv1.weight"] == (1280, 128, 3)
        assert sum(k.endswith("encoder_attn.q_proj.weight") for k in shapes) == n


def _real_folder():
    from sdk.errors import ModelNotFound
    from sdk.hub import resolve
    try:
        return resolve("whisper-tiny.en").path
    except ModelNotFound as e:
        pytest.skip(f"whisper tiny.en is not installed: {e}")


def hf_model_from(cfg: W.Config, weights):
    """transformers' WhisperForConditionalGeneration holding our weights (for reference checks)."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    hf_cfg = WhisperConfig(**cfg.__dict__, decoder_start_token_id=50257, pad_token_id=50256, eos_token_id=50256,
                           bos_token_id=50257)
    model = WhisperForConditionalGeneration(hf_cfg).eval()
    state = {k: torch.from_numpy(v) for k, v in weights.items()}
    state["proj_out.weight"] = state["model.decoder.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and not [m for m in missing if "proj_out" not in m]
    return model


@pytest.mark.reference
def test_real_tiny_en_logits_vs_transformers(record_parity):
    import torch
    cfg, weights = W.load(_real_folder())
    model = hf_model_from(cfg, weights)
    import soundfile as sf
    audio, _ = sf.read("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0880.wav",
                       dtype="float32")
    from pipelines.audio import whisper_log_mel
    mel = whisper_log_mel(audio, cfg.num_mel_bins)[None]
    tokens = [50257, 50362, 679, 373, 407]  # <|startoftranscript|> <|notimestamps|> " He was not"
    with torch.no_grad():
        ref = model(input_features=torch.from_numpy(mel), decoder_input_ids=torch.tensor([tokens])).logits[0].numpy()
    s = Session(W.graphs(cfg), weights, device="cpu")
    state = s.new_state()
    s.run("encode", state, mel=mel)
    ours = np.stack([s.run("decode_step", state, tokens=np.array([[t]], np.int32), pos=p)["logits"][0, 0]
                     for p, t in enumerate(tokens)])
    assert record_parity("whisper-tiny.en.logits", ours, ref)[0] <= 1e-3


@pytest.mark.reference
def test_real_tiny_en_vs_ctranslate2(record_parity):
    """The real checkpoint is a CTranslate2 model.bin: here CTranslate2 itself reads and runs it, so unlike the
    transformers check above (which is handed the weights our loader mapped) a mapping bug cannot sit on both
    sides. The encoder output, then greedy decoding: the same tokens, and every step's logits."""
    ct2 = pytest.importorskip("ctranslate2", reason="needs the `reference` extra (ctranslate2)")
    from pipelines.audio import load_audio, whisper_log_mel
    folder = _real_folder()
    audio = load_audio("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0880.wav")
    mel = whisper_log_mel(audio, 80)[None]
    ref = ct2.models.Whisper(str(folder), device="cpu", compute_type="float32", intra_threads=2)
    ref_encoder = np.array(ref.encode(ct2.StorageView.from_array(mel), to_cpu=True))
    prompt = [50257, 50362]  # <|startoftranscript|> <|notimestamps|>
    greedy = ref.generate(ct2.StorageView.from_array(mel), [prompt], beam_size=1, max_length=64,
                          return_logits_vocab=True, suppress_blank=False, suppress_tokens=[])[0]
    ref_tokens, ref_logits = greedy.sequences_ids[0], np.stack([np.array(x) for x in greedy.logits[0]])

    cfg, weights = W.load(folder)
    s = Session(W.graphs(cfg), weights, device="cpu")
    state = s.new_state()
    encoder = s.run("encode", state, mel=mel)["encoder"]
    assert record_parity("whisper-tiny.en.encoder.vs-ctranslate2", encoder, ref_encoder)[0] <= 1e-3
    s.run("decode_step", state, tokens=np.array([[prompt[0]]], np.int32), pos=0)
    tokens, logits = [prompt[1]], []
    for pos in range(1, len(prompt) + len(ref_tokens)):  # the reference's tokens, then its end of text
        logits.append(s.run("decode_step", state, tokens=np.array([[tokens[-1]]], np.int32), pos=pos)["logits"][0, 0])
        tokens.append(int(logits[-1].argmax()))
    assert tokens[1:] == ref_tokens + [50256] and len(ref_tokens) >= 8
    assert record_parity("whisper-tiny.en.greedy-logits.vs-ctranslate2", np.stack(logits), ref_logits)[0] <= 1e-3


# ---- the Whisper recogniser's multilingual path on the TINY model (no multilingual weights exist offline) ----------

SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|de|>", "<|fr|>", "<|translate|>",
            "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]


@pytest.fixture
def tiny_folder(tmp_path):
    """The TINY checkpoint plus a word-level tokenizer.json with Whisper's special tokens at ids 70-80
    and timestamps from 81."""
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers
    for f in (FIX / "hf").iterdir():
        shutil.copy(f, tmp_path / f.name)
    vocab = {f"w{i}": i for i in range(70)} | {s: 70 + i for i, s in enumerate(SPECIALS)}
    vocab |= {f"<|{0.02 * i:.2f}|>": 81 + i for i in range(15)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIALS)
    tok.save(str(tmp_path / "tokenizer.json"))
    return tmp_path


def _fed(transcriber):
    """Record (entry, token, pos) of every decoder call."""
    calls, run = [], transcriber.session.run

    def spy(entry, state=None, **inputs):
        if "tokens" in inputs:
            calls.append((entry, int(inputs["tokens"][0, 0]), int(inputs["pos"])))
        return run(entry, state, **inputs)
    transcriber.session.run = spy
    return calls


@pytest.mark.parametrize("language", [None, "de"])
def test_multilingual_prompt_and_language_detection(tiny_folder, language):
    from pipelines.asr import TranscribeOptions, WhisperRecognizer
    t = WhisperRecognizer(str(tiny_folder), device="cpu")
    assert t.tokenizer.timestamp_begin == 81 and set(t.tokenizer.languages) == {"en", "de", "fr"}
    t.english_only = False  # the TINY vocabulary is far below Whisper's multilingual 51865
    t.options = TranscribeOptions(language=language, task="translate")
    calls, first_logits, fed = _fed(t), [], t.session.run

    def keep_first(entry, state=None, **inputs):
        out = fed(entry, state, **inputs)
        if not first_logits and entry == "decode_step":
            first_logits.append(out["logits"][0, 0].copy())
        return out
    t.session.run = keep_first
    audio = np.random.default_rng(0).standard_normal(16000 * 2).astype(np.float32) * 0.1
    result = t.transcribe(audio)
    assert result.language in ("en", "de", "fr") and (language is None or result.language == language)
    prompt = [(e, tok) for e, tok, pos in calls if pos < 3][-3:]
    assert [tok for _, tok in prompt] == [71, t.tokenizer.languages[result.language], 75]  # sot, lang, translate
    if language is None:  # detection reads <|startoftranscript|>'s logits among the language tokens
        assert calls[0] == ("decode_step", 71, 0)
        scores = {lang: first_logits[0][i] for lang, i in t.tokenizer.languages.items()}
        assert len(set(scores.values())) == 3 and result.language == max(scores, key=scores.get)


def test_temperature_fallback_samples_reproducibly(tiny_folder):
    """A log-prob threshold no output can meet forces every temperature; sampling is seeded."""
    from pipelines.asr import TranscribeOptions, WhisperRecognizer
    options = TranscribeOptions(temperatures=(0.0, 0.5, 1.0), logprob_threshold=0.0, no_speech_threshold=None)
    audio = np.random.default_rng(0).standard_normal(16000 * 2).astype(np.float32) * 0.1
    texts = []
    for _ in range(2):
        t = WhisperRecognizer(str(tiny_folder), device="cpu", options=options)
        calls = _fed(t)
        texts.append(t.transcribe(audio).text)
        greedy = [c for c in calls if c[0] == "decode_greedy"]
        sampled_steps = [c for c in calls if c[0] == "decode_step" and c[2] > 0]
        assert greedy and sampled_steps  # temperature 0 ran on the device, the fallbacks sampled full logits
    assert texts[0] == texts[1]


def test_cpu_graphs_join_the_cpu_backends_program_only():
    """Session(cpu_graphs=...) (Whisper's draft passes): the cpu backend runs them; emu (as the npu backend) compiles
    the program without them, the one `aie-apps build` lists."""
    cfg, weights = W.load(FIX / "hf")
    extra = [g for g in W.graphs(cfg, prefill=(3,)) if g.name == "decode_3"]
    for device, joined in (("cpu", True), ("emu", False)):
        with Session(W.graphs(cfg, timestamp_begin=TS_BEGIN), weights, device=device, cpu_graphs=extra) as s:
            assert ("decode_3" in s.program.entries) == joined, device
