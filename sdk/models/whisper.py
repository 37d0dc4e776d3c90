"""Whisper (tiny .. large-v3, turbo): a conv + transformer audio encoder and a transformer text decoder with
cross-attention, pre-LN, exact GELU, learned decoder positions, output projection tied to the token embedding.

Checkpoints: Hugging Face `WhisperForConditionalGeneration` safetensors (openai/whisper-*) and CTranslate2
`model.bin` (Systran/faster-whisper-*, the default tiny.en), both mapped onto transformers' names.
Reference: transformers' modeling_whisper.py.

Entries, all in ONE session so that weights are uploaded once and per-stream state is shared:
- `encode`: mel [1, n_mels, 2 * n_audio_ctx] -> encoder output [1, n_audio_ctx, d]; also writes each decoder
  layer's cross-attention K/V into STATE (`cross_k.{i}`, `cross_v.{i}`, ops.assign), once per 30 s window.
- Short windows (`windows()`): the same entries over a shorter audio context (whisper.cpp's `--audio-ctx`),
  each under its own name (`encode_t500`, `decode_step_t500`, `decode_greedy_t500` for 500 mel frames = 5 s):
  the encoder sees only that many frames with the first positional embeddings, writes the first positions of
  the cross K/V state, and the window's decoder entries attend to exactly those positions.
- `decode_step` (`decode_{n}` for n tokens at once): tokens [1, n] at runtime position `pos` -> logits
  [1, n, vocab]; the self-attention K/V are written into the STATE cache (`self_k.{i}`, `self_v.{i}`, static
  length n_text_ctx) at `pos` with ops.cache_write and read through a causal_cache_mask.
- `decode_greedy`: the same decoder step, then Whisper's logit filters on the device and only a handful of
  scalars back to the host (about 50 bytes per token in and out instead of the 4 x vocab bytes of the logits). The
  filters that depend on the token history are expressed as data so that the host stays exact and in charge:
  a bias table in STATE (`suppress`, row 0 = suppress_tokens, row 1 = those plus the begin-of-sample
  suppressions; written once per stream through the `set_suppress` entry) selected by the param `first`, plus
  two allowed token ranges [lo1, hi1) and [lo2, hi2) as runtime params (Whisper's timestamp rules are all
  ranges: text only, timestamps >= the last one, EOT). It returns, for the filtered log-probabilities, the
  best token overall and among timestamps with their log-probs and the timestamps' total log-prob, which is
  exactly what the rule "pick a timestamp when their summed probability beats every text token" and the
  avg-logprob guard need. Sampling at temperature > 0 and the no-speech probability read `decode_step` logits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .. import ops
from ..errors import WeightError
from ..graph import Graph, trace
from ..weights import known_fields, map_weights, read_config, read_ctranslate2, read_safetensors


@dataclass(frozen=True)
class Config:
    vocab_size: int = 51865
    num_mel_bins: int = 80
    d_model: int = 384
    encoder_layers: int = 4
    encoder_attention_heads: int = 6
    encoder_ffn_dim: int = 1536
    decoder_layers: int = 4
    decoder_attention_heads: int = 6
    decoder_ffn_dim: int = 1536
    max_source_positions: int = 1500  # n_audio_ctx: encoder frames after the stride-2 conv (30 s)
    max_target_positions: int = 448   # n_text_ctx: the decoder's KV cache length

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        return cls(**known_fields(cls, d))

    @classmethod
    def from_ctranslate2(cls, ckpt: dict[str, np.ndarray]) -> "Config":
        """CTranslate2's config.json holds token lists only; the shapes say the rest."""
        def count(side):
            return sum(1 for k in ckpt if k.startswith(f"{side}/layer_") and k.endswith("ffn/linear_0/weight"))
        vocab, d = ckpt["decoder/embeddings/weight"].shape
        return cls(vocab_size=vocab, num_mel_bins=ckpt["encoder/conv1/weight"].shape[1], d_model=d,
                   encoder_layers=count("encoder"), encoder_attention_heads=int(ckpt["encoder/num_heads"]),
                   encoder_ffn_dim=ckpt["encoder/layer_0/ffn/linear_0/weight"].shape[0],
                   decoder_layers=count("decoder"), decoder_attention_heads=int(ckpt["decoder/num_heads"]),
                   decoder_ffn_dim=ckpt["decoder/layer_0/ffn/linear_0/weight"].shape[0],
                   max_source_positions=ckpt["encoder/position_encodings/encodings"].shape[0],
                   max_target_positions=ckpt["decoder/position_encodings/encodings"].shape[0])

    @property
    def n_frames(self) -> int:
        return 2 * self.max_source_positions  # mel frames per window (3000 = 30 s at 10 ms)


TINY = Config(vocab_size=96, num_mel_bins=8, d_model=32, encoder_layers=2, encoder_attention_heads=4,
              encoder_ffn_dim=48, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=48,
              max_source_positions=64, max_target_positions=24)

EPS = 1e-5


def _layer_shapes(p: str, d: int, ffn: int, cross: bool) -> dict[str, tuple]:
    shapes = {}
    for attn in ("self_attn", "encoder_attn") if cross else ("self_attn",):
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[f"{p}{attn}.{proj}.weight"] = (d, d)
            if proj != "k_proj":  # Whisper's key projections have no bias
                shapes[f"{p}{attn}.{proj}.bias"] = (d,)
        shapes[f"{p}{attn}_layer_norm.weight"] = shapes[f"{p}{attn}_layer_norm.bias"] = (d,)
    return shapes | {f"{p}fc1.weight": (ffn, d), f"{p}fc1.bias": (ffn,), f"{p}fc2.weight": (d, ffn),
                     f"{p}fc2.bias": (d,), f"{p}final_layer_norm.weight": (d,), f"{p}final_layer_norm.bias": (d,)}


def param_shapes(cfg: Config) -> dict[str, tuple]:
    d, e, t = cfg.d_model, "model.encoder.", "model.decoder."
    shapes = {e + "conv1.weight": (d, cfg.num_mel_bins, 3), e + "conv1.bias": (d,),
              e + "conv2.weight": (d, d, 3), e + "conv2.bias": (d,),
              e + "embed_positions.weight": (cfg.max_source_positions, d),
              e + "layer_norm.weight": (d,), e + "layer_norm.bias": (d,),
              t + "embed_tokens.weight": (cfg.vocab_size, d),  # also the output projection (tied proj_out)
              t + "embed_positions.weight": (cfg.max_target_positions, d),
              t + "layer_norm.weight": (d,), t + "layer_norm.bias": (d,)}
    for i in range(cfg.encoder_layers):
        shapes |= _layer_shapes(f"{e}layers.{i}.", d, cfg.encoder_ffn_dim, cross=False)
    for i in range(cfg.decoder_layers):
        shapes |= _layer_shapes(f"{t}layers.{i}.", d, cfg.decoder_ffn_dim, cross=True)
    return shapes


# Hugging Face safetensors: our names are transformers' names.
WEIGHT_MAP = [("{name}", "{name}")]
IGNORED = [r"^proj_out\.weight$"]  # tied to model.decoder.embed_tokens.weight

# CTranslate2 names, after `_unfuse` has split the fused QKV / KV projections into query/key/value.
_LN = [("self_attn_layer_norm", "self_attention/layer_norm"), ("encoder_attn_layer_norm", "attention/layer_norm"),
       ("final_layer_norm", "ffn/layer_norm")]
_LINEAR = [("self_attn.q_proj", "self_attention/query"), ("self_attn.k_proj", "self_attention/key"),
           ("self_attn.v_proj", "self_attention/value"), ("self_attn.out_proj", "self_attention/linear_1"),
           ("encoder_attn.q_proj", "attention/linear_0"), ("encoder_attn.k_proj", "attention/key"),
           ("encoder_attn.v_proj", "attention/value"), ("encoder_attn.out_proj", "attention/linear_2"),
           ("fc1", "ffn/linear_0"), ("fc2", "ffn/linear_1")]
CT2_WEIGHT_MAP = [
    *[(f"model.{side}.layers.{{i}}.{ours}.{w}", f"{side}/layer_{{i}}/{theirs}/{c}")
      for side in ("encoder", "decoder") for ours, theirs in _LN for w, c in (("weight", "gamma"), ("bias", "beta"))],
    *[(f"model.{side}.layers.{{i}}.{ours}.{{name}}", f"{side}/layer_{{i}}/{theirs}/{{name}}")
      for side in ("encoder", "decoder") for ours, theirs in _LINEAR],
    *[(f"model.{side}.layer_norm.{w}", f"{side}/layer_norm/{c}")
      for side in ("encoder", "decoder") for w, c in (("weight", "gamma"), ("bias", "beta"))],
    ("model.encoder.conv{i}.{name}", "encoder/conv{i}/{name}"),
    ("model.encoder.embed_positions.weight", "encoder/position_encodings/encodings"),
    ("model.decoder.embed_positions.weight", "decoder/position_encodings/encodings"),
    ("model.decoder.embed_tokens.weight", "decoder/embeddings/weight"),
]
# Scalar metadata, the tied projection alias, and the zero key biases dropped by _unfuse.
CT2_IGNORED = [r"^(encoder|decoder)/[a-z_]+$", r"^decoder/projection/weight$", r"/key/bias$"]


def _unfuse(ckpt: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Split CTranslate2's fused projections: self-attention QKV [3d, d] and cross-attention KV [2d, d].
    The key bias is dropped: CT2 stores zeros, and a key bias cannot change attention (it adds the same
    q.b to every score of a row, which softmax ignores)."""
    out = {}
    for name, array in ckpt.items():
        head, _, leaf = name.rpartition("/")
        if head.endswith("self_attention/linear_0"):
            parts = ("query", "key", "value")
        elif head.startswith("decoder/") and head.endswith("/attention/linear_1"):
            parts = ("key", "value")
        else:
            out[name] = array
            continue
        base = head.rsplit("/", 1)[0]
        for part, chunk in zip(parts, np.split(array, len(parts), axis=0)):
            out[f"{base}/{part}/{leaf}"] = chunk
    return out


# ---- the computation ----------------------------------------------------------------------------

def _attention(w, p: str, x, kv, H: int, state_kv=None, mask=None, pos=None):
    """Multi-head attention of x [1, T, d] over kv [1, S, d] (or, with state_kv, a cache in STATE)."""
    B, T, d = x.shape
    D = d // H

    def heads(t):
        return t.reshape(B, t.shape[1], H, D).transpose(0, 2, 1, 3)

    q = heads(ops.linear(x, w[p + "q_proj.weight"], w[p + "q_proj.bias"]))
    if state_kv is None or pos is not None:
        k = heads(ops.linear(kv, w[p + "k_proj.weight"]))
        v = heads(ops.linear(kv, w[p + "v_proj.weight"], w[p + "v_proj.bias"]))
    if state_kv is not None:
        k_cache, v_cache = state_kv
        if pos is not None:  # self-attention: append this step's K/V to the cache
            k, v = ops.cache_write(k_cache, k, pos, axis=2), ops.cache_write(v_cache, v, pos, axis=2)
        else:                # cross-attention: K/V were written by `encode`
            k, v = k_cache, v_cache
    a = ops.attention(q, k, v, mask, scale=1 / math.sqrt(D)).transpose(0, 2, 1, 3).reshape(B, T, d)
    return ops.linear(a, w[p + "out_proj.weight"], w[p + "out_proj.bias"])


def _mlp(w, p: str, x):
    h = ops.layer_norm(x, w[p + "final_layer_norm.weight"], w[p + "final_layer_norm.bias"], eps=EPS)
    h = ops.gelu(ops.linear(h, w[p + "fc1.weight"], w[p + "fc1.bias"]))
    return x + ops.linear(h, w[p + "fc2.weight"], w[p + "fc2.bias"])


def _ln(w, name: str, x):
    return ops.layer_norm(x, w[name + ".weight"], w[name + ".bias"], eps=EPS)


def encode(w, mel, *, state, cfg: Config):
    """mel [1, n_mels, n_frames] -> encoder output [1, n_audio_ctx, d]; fills the cross-attention K/V."""
    e = "model.encoder."
    x = ops.gelu(ops.conv1d(mel, w[e + "conv1.weight"], w[e + "conv1.bias"], padding=1))
    x = ops.gelu(ops.conv1d(x, w[e + "conv2.weight"], w[e + "conv2.bias"], stride=2, padding=1))
    n_audio = x.shape[2]
    table = w[e + "embed_positions.weight"]
    x = x.transpose(0, 2, 1) + (table[:n_audio] if table.shape[0] > n_audio else table)
    for i in range(cfg.encoder_layers):
        p = f"{e}layers.{i}."
        h = _ln(w, p + "self_attn_layer_norm", x)
        x = x + _attention(w, p + "self_attn.", h, h, cfg.encoder_attention_heads)
        x = _mlp(w, p, x)
    x = _ln(w, e + "layer_norm", x)
    H = cfg.decoder_attention_heads
    for i in range(cfg.decoder_layers):
        p = f"model.decoder.layers.{i}.encoder_attn."
        k = ops.linear(x, w[p + "k_proj.weight"])
        v = ops.linear(x, w[p + "v_proj.weight"], w[p + "v_proj.bias"])
        for name, t in ((f"cross_k.{i}", k), (f"cross_v.{i}", v)):
            t = t.reshape(1, n_audio, H, -1).transpose(0, 2, 1, 3)
            full = state[name].shape[2]
            if full != n_audio:  # a short window fills the first n_audio positions; its decoder entries read only
                # those. A whole-state write of the zero-padded K/V, not a cache write at a constant position: the
                # NPU designs take positions only from host-known params.
                t = ops.pad(t, pads=((0, 0), (0, 0), (0, full - n_audio), (0, 0)))
            ops.assign(state[name], t)
    return {"encoder": x}


def decode(w, tokens, pos, *, state, cfg: Config):
    """tokens [1, n] at positions pos..pos+n-1 -> final hidden state [1, n, d]; appends to the KV cache."""
    t, n = "model.decoder.", tokens.shape[1]
    x = ops.embedding(w[t + "embed_tokens.weight"], tokens)
    x = x + ops.embedding(w[t + "embed_positions.weight"], ops.positions(pos, n=n))
    mask = ops.causal_cache_mask(pos, n_new=n, size=cfg.max_target_positions)
    H = cfg.decoder_attention_heads
    for i in range(cfg.decoder_layers):
        p = f"{t}layers.{i}."
        h = _ln(w, p + "self_attn_layer_norm", x)
        x = x + _attention(w, p + "self_attn.", h, h, H, (state[f"self_k.{i}"], state[f"self_v.{i}"]), mask, pos)
        h = _ln(w, p + "encoder_attn_layer_norm", x)
        x = x + _attention(w, p + "encoder_attn.", h, None, H, _cross(state, i, cfg.max_source_positions))
        x = _mlp(w, p, x)
    return _ln(w, t + "layer_norm", x)


def _cross(state, i: int, n_audio: int):
    """Layer i's cross-attention K/V over the window's n_audio encoder positions (a view of the state)."""
    k, v = state[f"cross_k.{i}"], state[f"cross_v.{i}"]
    return (k, v) if k.shape[2] == n_audio else (k[:, :, :n_audio], v[:, :, :n_audio])


def decode_logits(w, tokens, pos, *, state, cfg: Config):
    x = decode(w, tokens, pos, state=state, cfg=cfg)
    return {"logits": ops.linear(x, w["model.decoder.embed_tokens.weight"])}


def _in_range(lo, hi, size: int):
    """NEG_INF for lo <= j < hi, exactly 0 elsewhere, as a [size] tensor (the difference of two padding masks)."""
    return ops.length_mask(lo, size=size) - ops.length_mask(hi, size=size)


def decode_greedy(w, tokens, pos, first, lo1, hi1, lo2, hi2, *, state, cfg: Config, timestamp_begin: int):
    """One decoder step, Whisper's filters on the device, and the scalars greedy decoding needs.

    Filtered logits z = logits + suppress[first] + (0 inside [lo1, hi1) or [lo2, hi2), NEG_INF outside); the
    ranges must not overlap (one lies below timestamp_begin, the other above). Returns the best token of z
    and its log-prob, the best timestamp (index from timestamp_begin) with its log-prob among timestamps
    only, and the log of the timestamps' summed probability."""
    V = cfg.vocab_size
    logits = decode_logits(w, tokens, pos, state=state, cfg=cfg)["logits"].reshape(1, V)
    bias = ops.embedding(state["suppress"], ops.positions(first, n=1))  # row 0 or 1 of the bias table
    outside = float(ops.NEG_INF) - (_in_range(lo1, hi1, V) + _in_range(lo2, hi2, V))
    logprobs = ops.log_softmax(logits + bias + outside, axis=-1)
    ts_logprobs = logprobs[:, timestamp_begin:]
    within_ts = ops.log_softmax(ts_logprobs, axis=-1)  # = ts_logprobs - logsumexp(ts_logprobs)

    def at(lp, i):  # lp[0, i] for an index tensor i [1], as an embedding lookup into lp's column
        return ops.embedding(lp.reshape(lp.shape[1], 1), i).reshape(1)

    best, ts_best = ops.argmax(logprobs, axis=-1), ops.argmax(within_ts, axis=-1)
    return {"token": best, "logprob": at(logprobs, best), "ts_token": ts_best, "ts_logprob": at(within_ts, ts_best),
            "ts_total": at(ts_logprobs, ts_best) - at(within_ts, ts_best)}


def set_suppress(w, bias, *, state):
    return {"suppress": ops.assign(state["suppress"], bias)}


def _state(cfg: Config) -> dict[str, tuple]:
    d = cfg.d_model
    s = {}
    for i in range(cfg.decoder_layers):
        Dh, H = d // cfg.decoder_attention_heads, cfg.decoder_attention_heads
        for kind, length in (("self", cfg.max_target_positions), ("cross", cfg.max_source_positions)):
            s[f"{kind}_k.{i}"] = s[f"{kind}_v.{i}"] = ((1, H, length, Dh), "float32")
    return s


@dataclass(frozen=True)
class Window:
    """One encoder window: how much audio it holds and the names of its entries."""
    n_audio: int                      # encoder positions (n_audio_ctx); mel frames = 2 * n_audio
    full: bool                        # the checkpoint's own window (max_source_positions)

    @property
    def frames(self) -> int:
        return 2 * self.n_audio

    def entry(self, name: str) -> str:
        """`encode`, `decode_step`, `decode_greedy` or `decode_{n}` of this window."""
        return name if self.full else f"{name}_t{self.frames}"


def windows(cfg: Config, seconds: tuple[float, ...] = ()) -> list[Window]:
    """The short windows (seconds of Whisper's 30 s window, scaled to cfg's own window), then the full one."""
    n = cfg.max_source_positions
    short = sorted({max(1, round(n * s / WINDOW_SECONDS)) for s in seconds} - {n})
    return [Window(k, False) for k in short if k < n] + [Window(n, True)]


def _decode_graph(window: Window, n: int, shapes: dict, wcfg: Config, state: dict) -> Graph:
    """`decode_step` (n = 1) or `decode_{n}` of one window: logits of n tokens at `pos`."""
    return trace(decode_logits, name=window.entry("decode_step" if n == 1 else f"decode_{n}"), weights=shapes,
                 cfg=wcfg, state=state, inputs={"tokens": ((1, n), "int32")}, params={"pos": ((), "int32")})


def graphs(cfg: Config, *, timestamp_begin: int | None = None, prefill: tuple[int, ...] = (),
           encoder_windows: tuple[float, ...] = ()) -> list[Graph]:
    """Per window (`windows(cfg, encoder_windows)`): `encode`, `decode_step`, `decode_{n}` per prefill length,
    and (with the tokenizer's first timestamp id) `decode_greedy`; plus `set_suppress`: everything one
    transcription stream needs, for ONE session. The state (KV caches) is the full window's, shared by all."""
    shapes, state = param_shapes(cfg), _state(cfg)
    table = {"suppress": ((2, cfg.vocab_size), "float32")}
    out = []
    for window in sorted(windows(cfg, encoder_windows), key=lambda w: not w.full):  # the full window's first
        wcfg = replace(cfg, max_source_positions=window.n_audio)  # this window's audio context
        out.append(trace(encode, name=window.entry("encode"), weights=shapes, cfg=wcfg, state=state,
                         inputs={"mel": ((1, cfg.num_mel_bins, window.frames), "float32")}))
        out += [_decode_graph(window, n, shapes, wcfg, state) for n in (1, *prefill)]
        if timestamp_begin is not None:
            if window.full:
                out.append(trace(set_suppress, name="set_suppress", weights=shapes, state=table,
                                 inputs={"bias": ((2, cfg.vocab_size), "float32")}))
            scalars = {n: ((), "int32") for n in ("pos", "first", "lo1", "hi1", "lo2", "hi2")}
            out.append(trace(decode_greedy, name=window.entry("decode_greedy"), weights=shapes, cfg=wcfg,
                             state=state | table, timestamp_begin=timestamp_begin,
                             inputs={"tokens": ((1, 1), "int32")}, params=scalars))
    return out


# The program the pipelines run takes its shapes from these constants, so a new bucket is a one-line change that
# the pipelines, the build and bench all see. PREFILL: decoder prefill lengths (decode_{n}) of every window; none
# today. DRAFT_PASSES: the decode_{n} lengths that verify a live decode's draft in one pass (a longer draft is cut
# to the longest), in every window (a long utterance's live decode runs in the full one): cpu-only entries, since the
# NPU compiler cannot tile a multi-row output head over a 51864 vocabulary. The cpu backend builds an entry at its
# first run, so entries that files never run cost nothing at startup.
# ENCODER_WINDOWS: the short encoder windows, in seconds of Whisper's 30 s one; audio runs in the shortest that
# holds it (pipelines/whisper_asr.py, where each model's WER gate sets the shortest it may use). The encoder's time is
# about proportional to the window; 5 and 10 s hold single utterances, 15 and 20 s a dictation decode (6 s of
# left context + the utterance), and whisper-base keeps its accuracy in all four.
PREFILL: tuple[int, ...] = ()
DRAFT_PASSES: tuple[int, ...] = (32, 64)
ENCODER_WINDOWS: tuple[float, ...] = (5.0, 10.0, 15.0, 20.0)
WINDOW_SECONDS = 30.0  # the window every Whisper checkpoint was trained on (max_source_positions = 1500)
# The entries that may run with int8 weights on the cpu backend (--precision int8), in every window: the decoder
# steps (layers and the tied head), which read every weight once per token, so int8's 4x fewer bytes make a step
# faster. They pass the WER gate (within 0.5 points of fp32 on LibriVox clips, flite speech and two long files, for
# tiny.en and whisper-base: tests/test_transcribe.py, bench/whisper_windows.py int8). The encoder, compute-bound,
# is no faster in int8 and does not pass it (flite). Each int8 entry's session holds its own packed weights.
INT8_ENTRIES = ("decode_step", "decode_greedy", *(f"decode_{n}" for n in PREFILL + DRAFT_PASSES))


def program_graphs(cfg: Config, timestamp_begin: int) -> list[Graph]:
    """Every graph of one transcription session (pipelines/whisper_asr.py): what `aie-apps build` compiles for Whisper."""
    return graphs(cfg, timestamp_begin=timestamp_begin, prefill=PREFILL, encoder_windows=ENCODER_WINDOWS)


def draft_graphs(cfg: Config) -> list[Graph]:
    """The draft passes (`decode_{n}` for n in DRAFT_PASSES) of each window: what the cpu backend adds to
    program_graphs. Lengths past the KV cache are left out."""
    shapes, state = param_shapes(cfg), _state(cfg)
    return [_decode_graph(window, n, shapes, replace(cfg, max_source_positions=window.n_audio), state)
            for window in windows(cfg, ENCODER_WINDOWS)
            for n in DRAFT_PASSES if n <= cfg.max_target_positions]


def load(folder: str | Path) -> tuple[Config, dict[str, np.ndarray]]:
    """A Hugging Face folder (config.json + model.safetensors) or a CTranslate2 one (model.bin)."""
    folder = Path(folder)
    if (folder / "model.safetensors").exists():
        cfg = Config.from_dict(read_config(folder))
        weights = map_weights(read_safetensors(folder / "model.safetensors"), WEIGHT_MAP, param_shapes(cfg),
                              ignore=IGNORED, source=str(folder))
    elif (folder / "model.bin").exists():
        ckpt = read_ctranslate2(folder / "model.bin")
        if "decoder/embeddings/weight" not in ckpt or "encoder/conv1/weight" not in ckpt:
            raise WeightError(f"{folder / 'model.bin'} is not a CTranslate2 Whisper model",
                              fix="pass a faster-whisper (CTranslate2 WhisperSpec) model folder")
        cfg = Config.from_ctranslate2(ckpt)
        weights = map_weights(_unfuse(ckpt), CT2_WEIGHT_MAP, param_shapes(cfg), ignore=CT2_IGNORED,
                              source=str(folder))
    else:
        raise WeightError(f"{folder} has neither model.safetensors nor model.bin",
                          fix="pass a Whisper folder from Hugging Face (openai/whisper-*) or faster-whisper")
    return cfg, weights
