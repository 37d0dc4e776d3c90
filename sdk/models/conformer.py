"""Conformer speech encoders and their heads: Parakeet (NVIDIA FastConformer) and GigaAM (Sber).

One block serves both families: macaron feed-forward halves, self-attention (relative positions with
Transformer-XL biases, or GigaAM's rotary variant), a convolution module (pointwise conv + GLU, depthwise conv
with batch norm folded in at load, SiLU, pointwise conv), and a final layer norm. They differ in subsampling
(FastConformer: a strided conv, then depthwise-strided + pointwise pairs, 8x; GigaAM: plain strided convs, 4x),
input scaling, and checkpoint names.

Heads: CTC (a 1x1 conv = linear over classes), and transducers: RNN-T (LSTM prediction network + joint) and TDT
(the same joint with extra duration logits). The encoder is one graph per static audio-length bucket; the
prediction network step and the joint are two small graphs that the decoding loop (pipelines/conformer_asr.py)
calls per emitted token.

References: transformers' modeling_parakeet.py (ParakeetForCTC / ParakeetForTDT) and the `gigaam` package's
encoder.py / decoder.py. Our weight names are transformers' Parakeet names; GigaAM names map onto them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import ops
from ..errors import UsageError
from ..graph import Graph, trace
from ..weights import known_fields, map_weights, read_config, read_safetensors, read_safetensors_shards


@dataclass(frozen=True)
class Config:
    model_type: str = "parakeet_ctc"   # parakeet_ctc | parakeet_tdt | parakeet_rnnt | gigaam
    head: str = "ctc"                  # ctc | tdt | rnnt
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 8
    intermediate_size: int = 4096
    conv_kernel_size: int = 9
    subsampling: str = "dw_striding"   # dw_striding (FastConformer) | striding (GigaAM)
    subsampling_factor: int = 8
    subsampling_conv_channels: int = 256
    num_mel_bins: int = 80
    attention: str = "rel_pos"         # rel_pos | rotary
    rotary_base: float = 10000.0
    scale_input: bool = True
    attention_bias: bool = True
    convolution_bias: bool = True
    vocab_size: int = 1025             # output classes, blank included
    blank_id: int = 1024
    decoder_hidden_size: int = 640     # prediction network (LSTM) width
    joint_hidden_size: int = 640
    num_decoder_layers: int = 2
    durations: tuple[int, ...] = ()    # TDT only
    max_symbols_per_step: int = 10
    layer_norm_eps: float = 1e-5

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        """From a transformers Parakeet config.json, or from GigaAM's (hydra) config saved as JSON."""
        kind = d.get("model_type")
        if kind == "gigaam":
            return cls._from_gigaam(d)
        if kind not in ("parakeet_ctc", "parakeet_tdt", "parakeet_rnnt"):
            raise UsageError(f"model_type {kind!r} is not a conformer ASR model",
                             fix="use a Parakeet CTC/TDT/RNN-T (transformers format) or GigaAM checkpoint folder")
        enc = d.get("encoder_config") or {}
        own = known_fields(cls, enc, skip=("model_type",))
        head = {"parakeet_ctc": "ctc", "parakeet_tdt": "tdt", "parakeet_rnnt": "rnnt"}[kind]
        blank = d.get("pad_token_id", 1024) if head == "ctc" else d.get("blank_token_id", 8192)
        dec = d.get("decoder_hidden_size", 640)
        return cls(**own, model_type=kind, head=head, vocab_size=d.get("vocab_size", 1025), blank_id=blank,
                   decoder_hidden_size=dec, joint_hidden_size=dec,
                   num_decoder_layers=d.get("num_decoder_layers", 2),
                   durations=tuple(d.get("durations", (0, 1, 2, 3, 4))) if head == "tdt" else (),
                   max_symbols_per_step=d.get("max_symbols_per_step", 10))

    @classmethod
    def _from_gigaam(cls, d: dict) -> "Config":
        enc, head = d["encoder"], d["head"]
        rnnt = "decoder" in head
        classes = head["joint"]["num_classes"] if rnnt else head["num_classes"]
        extra = dict(head="rnnt", decoder_hidden_size=head["decoder"]["pred_hidden"],
                     num_decoder_layers=head["decoder"]["pred_rnn_layers"],
                     joint_hidden_size=head["joint"]["joint_hidden"]) if rnnt else dict(head="ctc")
        return cls(model_type="gigaam", hidden_size=enc["d_model"], num_hidden_layers=enc["n_layers"],
                   num_attention_heads=enc["n_heads"], intermediate_size=enc["d_model"] * enc.get("ff_expansion_factor", 4),
                   conv_kernel_size=enc.get("conv_kernel_size", 31), subsampling="striding",
                   subsampling_factor=enc.get("subsampling_factor", 4), subsampling_conv_channels=enc["d_model"],
                   num_mel_bins=enc.get("feat_in", 64), attention=enc.get("self_attention_model", "rotary"),
                   rotary_base=float(enc.get("pos_emb_max_len", 5000)), scale_input=False,
                   vocab_size=classes, blank_id=classes - 1,
                   max_symbols_per_step=d.get("decoding", {}).get("max_symbols_per_step", 10), **extra)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_stages(self) -> int:
        return int(math.log2(self.subsampling_factor))

    def output_length(self, frames: int) -> list[int]:
        """Valid lengths after each stride-2 stage, starting with the input: [frames, ..., encoder frames]."""
        lengths = [int(frames)]
        for _ in range(self.num_stages):  # kernel 3, padding 1, stride 2
            lengths.append((lengths[-1] - 1) // 2 + 1)
        return lengths


TINY = Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_kernel_size=9,
              subsampling_conv_channels=16, num_mel_bins=80, vocab_size=41, blank_id=40)


def _subsampling_convs(cfg: Config) -> list[tuple[int, str]]:
    """(index in the checkpoint's layer list, kind) of each subsampling conv, in order."""
    if cfg.subsampling == "striding":  # conv, relu, conv, relu, ...
        return [(2 * s, "full") for s in range(cfg.num_stages)]
    convs = [(0, "full")]  # conv, relu, then per stage: depthwise, pointwise, relu
    for s in range(cfg.num_stages - 1):
        convs += [(2 + 3 * s, "depthwise"), (3 + 3 * s, "pointwise")]
    return convs


def checkpoint_shapes(cfg: Config) -> dict[str, tuple]:
    """Every tensor a checkpoint holds, under our names and in its stored layout (3-D convs, batch norm)."""
    h, f, ch, k = cfg.hidden_size, cfg.intermediate_size, cfg.subsampling_conv_channels, cfg.conv_kernel_size
    s = {}
    for idx, kind in _subsampling_convs(cfg):
        c_in = 1 if idx == 0 else ch
        shape = {"full": (ch, c_in, 3, 3), "depthwise": (ch, 1, 3, 3), "pointwise": (ch, ch, 1, 1)}[kind]
        s[f"encoder.subsampling.layers.{idx}.weight"], s[f"encoder.subsampling.layers.{idx}.bias"] = shape, (ch,)
    freq = cfg.num_mel_bins // cfg.subsampling_factor if cfg.subsampling == "dw_striding" else \
        cfg.output_length(cfg.num_mel_bins)[-1]
    s["encoder.subsampling.linear.weight"], s["encoder.subsampling.linear.bias"] = (h, ch * freq), (h,)
    ab, cb = cfg.attention_bias, cfg.convolution_bias
    for i in range(cfg.num_hidden_layers):
        p = f"encoder.layers.{i}."
        for n in ("norm_feed_forward1", "norm_self_att", "norm_conv", "norm_feed_forward2", "norm_out"):
            s[p + n + ".weight"], s[p + n + ".bias"] = (h,), (h,)
        for ff in ("feed_forward1", "feed_forward2"):
            s[p + ff + ".linear1.weight"], s[p + ff + ".linear2.weight"] = (f, h), (h, f)
            if ab:
                s[p + ff + ".linear1.bias"], s[p + ff + ".linear2.bias"] = (f,), (h,)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            s[p + f"self_attn.{proj}.weight"] = (h, h)
            if ab:
                s[p + f"self_attn.{proj}.bias"] = (h,)
        if cfg.attention == "rel_pos":
            s[p + "self_attn.relative_k_proj.weight"] = (h, h)
            s[p + "self_attn.bias_u"] = s[p + "self_attn.bias_v"] = (cfg.num_attention_heads, cfg.head_dim)
        s[p + "conv.pointwise_conv1.weight"], s[p + "conv.depthwise_conv.weight"] = (2 * h, h, 1), (h, 1, k)
        s[p + "conv.pointwise_conv2.weight"] = (h, h, 1)
        if cb:
            s[p + "conv.pointwise_conv1.bias"], s[p + "conv.depthwise_conv.bias"] = (2 * h,), (h,)
            s[p + "conv.pointwise_conv2.bias"] = (h,)
        for n in ("weight", "bias", "running_mean", "running_var"):
            s[p + "conv.norm." + n] = (h,)
    v, dh, jh = cfg.vocab_size, cfg.decoder_hidden_size, cfg.joint_hidden_size
    if cfg.head == "ctc":
        s["ctc_head.weight"], s["ctc_head.bias"] = (v, h, 1), (v,)
        return s
    s["encoder_projector.weight"], s["encoder_projector.bias"] = (jh, h), (jh,)
    s["decoder.embedding.weight"] = (v, dh)
    for j in range(cfg.num_decoder_layers):
        s[f"decoder.lstm.weight_ih_l{j}"] = s[f"decoder.lstm.weight_hh_l{j}"] = (4 * dh, dh)
        s[f"decoder.lstm.bias_ih_l{j}"] = s[f"decoder.lstm.bias_hh_l{j}"] = (4 * dh,)
    s["decoder.decoder_projector.weight"], s["decoder.decoder_projector.bias"] = (jh, dh), (jh,)
    s["joint.head.weight"], s["joint.head.bias"] = (v + len(cfg.durations), jh), (v + len(cfg.durations),)
    return s


def param_shapes(cfg: Config) -> dict[str, tuple]:
    """What the graphs read: batch norm folded into the depthwise conv, 1x1 convs as [out, in] matrices,
    the two LSTM biases summed."""
    out = {}
    for name, shape in checkpoint_shapes(cfg).items():
        if ".conv.norm." in name or "lstm.bias_hh" in name:
            continue
        if name.endswith(("pointwise_conv1.weight", "pointwise_conv2.weight")) or name == "ctc_head.weight":
            shape = shape[:2]
        out[name.replace("bias_ih_", "bias_")] = shape
    for i in range(cfg.num_hidden_layers):  # folding batch norm always gives the depthwise conv a bias
        out[f"encoder.layers.{i}.conv.depthwise_conv.bias"] = (cfg.hidden_size,)
    return out


# Parakeet checkpoints use our names. GigaAM's rows: first match wins.
WEIGHT_MAP = [("{name}", "{name}")]
GIGAAM_WEIGHT_MAP = [
    ("encoder.subsampling.layers.{i}.{name}", "encoder.pre_encode.conv.{i}.{name}"),
    ("encoder.subsampling.linear.{name}", "encoder.pre_encode.out.{name}"),
    ("encoder.layers.{i}.self_attn.q_proj.{name}", "encoder.layers.{i}.self_attn.linear_q.{name}"),
    ("encoder.layers.{i}.self_attn.k_proj.{name}", "encoder.layers.{i}.self_attn.linear_k.{name}"),
    ("encoder.layers.{i}.self_attn.v_proj.{name}", "encoder.layers.{i}.self_attn.linear_v.{name}"),
    ("encoder.layers.{i}.self_attn.o_proj.{name}", "encoder.layers.{i}.self_attn.linear_out.{name}"),
    ("encoder.layers.{i}.self_attn.relative_k_proj.{name}", "encoder.layers.{i}.self_attn.linear_pos.{name}"),
    ("encoder.layers.{i}.self_attn.bias_u", "encoder.layers.{i}.self_attn.pos_bias_u"),
    ("encoder.layers.{i}.self_attn.bias_v", "encoder.layers.{i}.self_attn.pos_bias_v"),
    ("encoder.layers.{i}.conv.norm.{name}", "encoder.layers.{i}.conv.batch_norm.{name}"),
    ("encoder.layers.{i}.{name}", "encoder.layers.{i}.{name}"),
    ("ctc_head.{name}", "head.decoder_layers.0.{name}"),
    ("encoder_projector.{name}", "head.joint.enc.{name}"),
    ("decoder.embedding.{name}", "head.decoder.embed.{name}"),
    ("decoder.lstm.{name}", "head.decoder.lstm.{name}"),
    ("decoder.decoder_projector.{name}", "head.joint.pred.{name}"),
    ("joint.head.{name}", "head.joint.joint_net.1.{name}"),
]
IGNORED = [r"num_batches_tracked$", r"^preprocessor\.", r"(^|\.)pos_enc\.pe$"]


def convert(cfg: Config, ckpt: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Checkpoint layout -> graph layout, once at load (see param_shapes)."""
    w = dict(ckpt)
    for i in range(cfg.num_hidden_layers):
        p = f"encoder.layers.{i}.conv."
        gamma, beta, mean, var = (w.pop(p + "norm." + n) for n in ("weight", "bias", "running_mean", "running_var"))
        scale = gamma / np.sqrt(var + np.float32(1e-5))
        bias = w.get(p + "depthwise_conv.bias", np.zeros_like(beta))
        w[p + "depthwise_conv.weight"] = w[p + "depthwise_conv.weight"] * scale[:, None, None]
        w[p + "depthwise_conv.bias"] = (bias - mean) * scale + beta
        for n in ("pointwise_conv1", "pointwise_conv2"):
            w[p + n + ".weight"] = w[p + n + ".weight"][:, :, 0]
    if "ctc_head.weight" in w:
        w["ctc_head.weight"] = w["ctc_head.weight"][:, :, 0]
    for j in range(cfg.num_decoder_layers if cfg.head != "ctc" else 0):
        w[f"decoder.lstm.bias_l{j}"] = w.pop(f"decoder.lstm.bias_ih_l{j}") + w.pop(f"decoder.lstm.bias_hh_l{j}")
    return {k: np.ascontiguousarray(v, np.float32) for k, v in w.items()}


# ---- the encoder --------------------------------------------------------------------------------------------

def _ones_mask(length, size):
    """1.0 for the first `length` positions, 0.0 after, from a runtime length (exp of the additive mask)."""
    return ops.exp(ops.length_mask(length, size=size))


def subsample(w, x, lengths, *, cfg: Config):
    """[B, T, mels] -> [B, T/factor, hidden]. A strided conv's last valid frame reads the frame past the valid
    ones, so each strided conv's input is zeroed past its valid length: the valid frames equal those of the
    unpadded input whatever the bucket. Only there (after the ReLU, which a conv then runs fused): a mask between
    two convs costs the cpu backend's blocked conv layout a conversion each way."""
    B, T, F = x.shape
    x = x.reshape(B, 1, T, F)
    stage, channels = 0, cfg.subsampling_conv_channels
    for idx, kind in _subsampling_convs(cfg):
        p = f"encoder.subsampling.layers.{idx}."
        if kind == "pointwise":
            x = ops.conv2d(x, w[p + "weight"], w[p + "bias"])
        else:
            x = x * _ones_mask(lengths[stage], x.shape[2]).reshape(1, 1, x.shape[2], 1)
            x = ops.conv2d(x, w[p + "weight"], w[p + "bias"], stride=2, padding=1,
                           groups=channels if kind == "depthwise" else 1)
            stage += 1
        if kind != "depthwise":
            x = ops.relu(x)
    B, C, T, F = x.shape
    x = x.transpose(0, 2, 1, 3).reshape(B, T, C * F)
    x = ops.linear(x, w["encoder.subsampling.linear.weight"], w["encoder.subsampling.linear.bias"])
    return x * math.sqrt(cfg.hidden_size) if cfg.scale_input else x


def relative_positions(n: int, dim: int) -> np.ndarray:
    """Sinusoids for relative distances n-1 .. -(n-1), sin and cos interleaved: [2n-1, dim]."""
    pos = np.arange(n - 1, -n, -1, dtype=np.float64)[:, None]
    angles = pos / 10000.0 ** (np.arange(0, dim, 2) / dim)
    return np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(2 * n - 1, dim).astype(np.float32)


def rotary_tables(n: int, dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [n, 1, dim] for rotate-half rotary embedding over one head."""
    freqs = np.arange(n, dtype=np.float32)[:, None] * (1.0 / base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    emb = np.concatenate([freqs, freqs], axis=-1)[:, None, :]
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def _lin(w, x, name, bias: bool):
    return ops.linear(x, w[name + ".weight"], w[name + ".bias"] if bias else None)


def attention(w, x, key_mask, pos, *, p: str, cfg: Config):
    B, T, _ = x.shape
    H, D, ab = cfg.num_attention_heads, cfg.head_dim, cfg.attention_bias

    def heads(t):
        return t.reshape(B, T, H, D).transpose(0, 2, 1, 3)

    if cfg.attention == "rotary":  # GigaAM rotates the layer input per head, before the q/k projections
        cos, sin = pos
        xr = ops.rotary(x.reshape(B, T, H, D), cos, sin).reshape(B, T, H * D)
        q, k, v = heads(_lin(w, xr, p + "q_proj", ab)), heads(_lin(w, xr, p + "k_proj", ab)), heads(_lin(w, x, p + "v_proj", ab))
        out = ops.attention(q, k, v, key_mask, scale=1 / math.sqrt(D))
    else:  # Transformer-XL: content bias u, position bias v, relative-shift trick
        q, k, v = (heads(_lin(w, x, p + n, ab)) for n in ("q_proj", "k_proj", "v_proj"))
        r = ops.linear(pos, w[p + "relative_k_proj.weight"]).reshape(1, 2 * T - 1, H, D).transpose(0, 2, 3, 1)
        bd = (q + w[p + "bias_v"].reshape(1, H, 1, D)) @ r                        # [B, H, T, 2T-1]
        bd = ops.pad(bd, pads=((0, 0), (0, 0), (0, 0), (1, 0))).reshape(B, H, 2 * T, T)[:, :, 1:]
        bd = bd.reshape(B, H, T, 2 * T - 1)[..., :T]                             # bd[i, j] = q_i . r(i - j)
        out = ops.attention(q + w[p + "bias_u"].reshape(1, H, 1, D), k, v, bd * (1 / math.sqrt(D)) + key_mask,
                            scale=1 / math.sqrt(D))
    return _lin(w, out.transpose(0, 2, 1, 3).reshape(B, T, H * D), p + "o_proj", ab)


def conv_module(w, x, time_mask, *, p: str, cfg: Config):
    cb = cfg.convolution_bias
    x = ops.glu(_lin(w, x, p + "pointwise_conv1", cb), axis=-1) * time_mask  # padding must not leak into valid frames
    x = ops.conv1d(x.transpose(0, 2, 1), w[p + "depthwise_conv.weight"], w[p + "depthwise_conv.bias"],
                   padding=(cfg.conv_kernel_size - 1) // 2, groups=cfg.hidden_size).transpose(0, 2, 1)
    return _lin(w, ops.silu(x), p + "pointwise_conv2", cb)


def feed_forward(w, x, p: str, cfg: Config):
    return _lin(w, ops.silu(_lin(w, x, p + ".linear1", cfg.attention_bias)), p + ".linear2", cfg.attention_bias)


def encode(w, features, *, cfg: Config, **lengths):
    """features [B, T, mels]; lengths length0..lengthN: valid frames at the input and after each stride-2 stage.
    Returns the encoder output and the head's per-frame output (CTC log-probs or the projected encoder)."""
    lengths = [lengths[f"length{s}"] for s in range(cfg.num_stages + 1)]
    x = subsample(w, features, lengths, cfg=cfg)
    B, T, h = x.shape
    key_mask = ops.length_mask(lengths[-1], size=T).reshape(1, 1, 1, T)
    time_mask = _ones_mask(lengths[-1], T).reshape(1, T, 1)
    g, eps = x.graph, cfg.layer_norm_eps
    if cfg.attention == "rotary":
        pos = tuple(g.constant(t) for t in rotary_tables(T, cfg.head_dim, cfg.rotary_base))
    else:
        pos = g.constant(relative_positions(T, h))

    def norm(t, name):
        return ops.layer_norm(t, w[name + ".weight"], w[name + ".bias"], eps=eps)

    for i in range(cfg.num_hidden_layers):
        p = f"encoder.layers.{i}."
        x = x + feed_forward(w, norm(x, p + "norm_feed_forward1"), p + "feed_forward1", cfg) * 0.5
        x = x + attention(w, norm(x, p + "norm_self_att"), key_mask, pos, p=p + "self_attn.", cfg=cfg)
        x = x + conv_module(w, norm(x, p + "norm_conv"), time_mask, p=p + "conv.", cfg=cfg)
        x = x + feed_forward(w, norm(x, p + "norm_feed_forward2"), p + "feed_forward2", cfg) * 0.5
        x = norm(x, p + "norm_out")
    if cfg.head == "ctc":
        return {"hidden": x, "log_probs": ops.log_softmax(ops.linear(x, w["ctc_head.weight"], w["ctc_head.bias"]))}
    return {"hidden": x, "projected": ops.linear(x, w["encoder_projector.weight"], w["encoder_projector.bias"])}


# ---- transducer decoder: one prediction-network step, and the joint ------------------------------------------

def predict(w, token, h, c, *, cfg: Config):
    """token int32 [1]; h, c [layers, 1, hidden]: one LSTM step (gates i, f, g, o as in torch.nn.LSTM).
    Returns the projected prediction-network output and the new state (the caller keeps it or not)."""
    n = cfg.decoder_hidden_size
    x = ops.embedding(w["decoder.embedding.weight"], token)
    hs, cs = [], []
    for j in range(cfg.num_decoder_layers):
        gates = (ops.linear(x, w[f"decoder.lstm.weight_ih_l{j}"], w[f"decoder.lstm.bias_l{j}"])
                 + ops.linear(h[j], w[f"decoder.lstm.weight_hh_l{j}"]))
        i, f, gg, o = (gates[:, k * n:(k + 1) * n] for k in range(4))
        c_j = ops.sigmoid(f) * c[j] + ops.sigmoid(i) * ops.tanh(gg)
        x = ops.sigmoid(o) * ops.tanh(c_j)
        hs.append(x.reshape(1, 1, n))
        cs.append(c_j.reshape(1, 1, n))
    dec = ops.linear(x, w["decoder.decoder_projector.weight"], w["decoder.decoder_projector.bias"])
    return {"dec": dec, "h": ops.concat(hs, axis=0), "c": ops.concat(cs, axis=0)}


def joint(w, enc, dec, *, cfg: Config):
    """enc, dec [1, joint hidden] -> logits [1, classes (+ durations for TDT)]."""
    return {"logits": ops.linear(ops.relu(enc + dec), w["joint.head.weight"], w["joint.head.bias"])}


# ---- graphs and loading ------------------------------------------------------------------------------------

def encoder_entry(frames: int) -> str:
    return f"encode_t{frames}"


def encoder_graph(cfg: Config, frames: int) -> Graph:
    """The encoder (with its head) for one bucket of `frames` feature frames, batch 1."""
    params = {f"length{s}": ((), "int32") for s in range(cfg.num_stages + 1)}
    return trace(encode, name=encoder_entry(frames), weights=param_shapes(cfg), cfg=cfg,
                 inputs={"features": ((1, frames, cfg.num_mel_bins), "float32")}, params=params)


def decoder_graphs(cfg: Config) -> list[Graph]:
    """The prediction-network step and the joint (transducers only)."""
    state = ((cfg.num_decoder_layers, 1, cfg.decoder_hidden_size), "float32")
    jh = ((1, cfg.joint_hidden_size), "float32")
    return [trace(predict, name="predict", weights=param_shapes(cfg), cfg=cfg,
                  inputs={"token": ((1,), "int32"), "h": state, "c": state}),
            trace(joint, name="joint", weights=param_shapes(cfg), cfg=cfg, inputs={"enc": jh, "dec": jh})]


# ---- the programs the pipelines run (pipelines/conformer_asr.py, kernels/build.py, apps/bench.py) -------------

SAMPLE_RATE, FEATURE_HOP = 16000, 160   # 10 ms feature frames at 16 kHz in both families


def frames_for(seconds: float) -> int:
    """Feature frames of `seconds` of audio (the front end's centred frames: one more than whole hops)."""
    return int(round(seconds * SAMPLE_RATE)) // FEATURE_HOP + 1


def encoder_buckets(window_seconds: float, buckets_seconds: tuple[float, ...]) -> list[int]:
    """Encoder lengths in frames: the buckets shorter than the window, then the window itself."""
    return sorted({frames_for(s) for s in buckets_seconds if s < window_seconds} | {frames_for(window_seconds)})


def program_graphs(cfg: Config, window_seconds: float, buckets_seconds: tuple[float, ...]) -> list[Graph]:
    """Every graph of one recogniser's session: the encoder at each bucket, and a transducer's decoder steps."""
    graphs = [encoder_graph(cfg, frames) for frames in encoder_buckets(window_seconds, buckets_seconds)]
    return graphs + (decoder_graphs(cfg) if cfg.head != "ctc" else [])


def read_checkpoint(folder: Path) -> dict[str, np.ndarray]:
    """model.safetensors, or every shard listed by model.safetensors.index.json (large Parakeet checkpoints)."""
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").exists() or not index.exists():
        return read_safetensors(folder / "model.safetensors")
    return read_safetensors_shards(folder, index.name)


def load(folder: str | Path) -> tuple[Config, dict[str, np.ndarray]]:
    folder = Path(folder)
    cfg = Config.from_dict(read_config(folder))
    ckpt = read_checkpoint(folder)
    table = GIGAAM_WEIGHT_MAP if cfg.model_type == "gigaam" else WEIGHT_MAP
    mapped = map_weights(ckpt, table, checkpoint_shapes(cfg), ignore=IGNORED, source=str(folder))
    return cfg, convert(cfg, mapped)
