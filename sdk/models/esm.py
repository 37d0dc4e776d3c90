"""ESM-2 protein language models (facebook/esm2_t6_8M_UR50D ... esm2_t36_3B_UR50D): token embeddings with
token-dropout rescaling, pre-LN transformer layers with rotary position embeddings, exact GELU, and a final
layer norm. Checkpoints: Hugging Face `EsmModel` / `EsmForMaskedLM` safetensors (with or without `esm.`).

Reference: transformers' modeling_esm.py (EsmModel) and fair-esm's ESM2. Outputs follow fair-esm's
`repr_layers`: layer 0 is the embedding output, layer k the output of block k, and the last layer is taken
after the final layer norm (`emb_layer_norm_after`), exactly like fair-esm's representations.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .. import ops
from ..errors import UsageError, WeightError
from ..graph import Graph, trace
from ..weights import known_fields, map_weights, read_config, read_safetensors

# ESM-2 was trained with 15% of residues selected and 80% of those replaced by <mask> (then zeroed by
# "token dropout"); at inference the embeddings are rescaled by the kept fraction, as in the reference.
MASK_RATIO_TRAIN = 0.15 * 0.8


@dataclass(frozen=True)
class Config:
    vocab_size: int = 33
    hidden_size: int = 320
    num_hidden_layers: int = 6
    num_attention_heads: int = 20
    intermediate_size: int = 1280
    max_position_embeddings: int = 1026
    layer_norm_eps: float = 1e-5
    hidden_act: str = "gelu"
    position_embedding_type: str = "rotary"
    rope_theta: float = 10000.0
    token_dropout: bool = True
    emb_layer_norm_before: bool = False
    mask_token_id: int = 32
    pad_token_id: int = 1

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        cfg = cls(**{k: v for k, v in known_fields(cls, d).items() if v is not None})
        if cfg.position_embedding_type != "rotary":
            raise UsageError(f"ESM checkpoint with position_embedding_type={cfg.position_embedding_type!r}: "
                             f"only rotary (ESM-2) models are supported",
                             fix="use an ESM-2 checkpoint (facebook/esm2_*); ESM-1b/ESM-1v use absolute positions")
        if cfg.hidden_act != "gelu":
            raise UsageError(f"ESM checkpoint with hidden_act={cfg.hidden_act!r}; ESM-2 uses exact gelu")
        return cfg

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


# The published ESM-2 sizes (Lin et al. 2023), as their config.json files give them.
PRESETS = {
    "esm2_t6_8M_UR50D": Config(hidden_size=320, num_hidden_layers=6, num_attention_heads=20, intermediate_size=1280),
    "esm2_t12_35M_UR50D": Config(hidden_size=480, num_hidden_layers=12, num_attention_heads=20,
                                 intermediate_size=1920),
    "esm2_t30_150M_UR50D": Config(hidden_size=640, num_hidden_layers=30, num_attention_heads=20,
                                  intermediate_size=2560),
    "esm2_t33_650M_UR50D": Config(hidden_size=1280, num_hidden_layers=33, num_attention_heads=20,
                                  intermediate_size=5120),
    "esm2_t36_3B_UR50D": Config(hidden_size=2560, num_hidden_layers=36, num_attention_heads=40,
                                intermediate_size=10240),
}

TINY = replace(PRESETS["esm2_t6_8M_UR50D"], hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
               intermediate_size=64, max_position_embeddings=130)


def param_shapes(cfg: Config) -> dict[str, tuple]:
    h, f = cfg.hidden_size, cfg.intermediate_size
    shapes = {"embeddings.word_embeddings.weight": (cfg.vocab_size, h)}
    if cfg.emb_layer_norm_before:
        shapes |= {"embeddings.layer_norm.weight": (h,), "embeddings.layer_norm.bias": (h,)}
    for i in range(cfg.num_hidden_layers):
        p = f"encoder.layer.{i}."
        for proj in ("query", "key", "value"):
            shapes[p + f"attention.self.{proj}.weight"] = (h, h)
            shapes[p + f"attention.self.{proj}.bias"] = (h,)
        shapes |= {p + "attention.output.dense.weight": (h, h), p + "attention.output.dense.bias": (h,),
                   p + "attention.LayerNorm.weight": (h,), p + "attention.LayerNorm.bias": (h,),
                   p + "intermediate.dense.weight": (f, h), p + "intermediate.dense.bias": (f,),
                   p + "output.dense.weight": (h, f), p + "output.dense.bias": (h,),
                   p + "LayerNorm.weight": (h,), p + "LayerNorm.bias": (h,)}
    shapes |= {"encoder.emb_layer_norm_after.weight": (h,), "encoder.emb_layer_norm_after.bias": (h,)}
    return shapes


# Our names are transformers' EsmModel names; the table says so row by row.
WEIGHT_MAP = [
    ("embeddings.{name}", "embeddings.{name}"),
    ("encoder.{name}", "encoder.{name}"),
]
# Keys an EsmModel / EsmForMaskedLM checkpoint carries that the encoder does not use. The rotary inverse
# frequencies are recomputed from the config (and checked against the checkpoint's copy in `load`).
IGNORED = [r"position_ids$", r"rotary_embeddings\.inv_freq$", r"(^|\.)pooler\.", r"(^|\.)contact_head\.",
           r"^lm_head\.", r"embeddings\.position_embeddings\.weight$"]


def resolve_layers(layers, num_layers: int) -> tuple[int, ...]:
    """fair-esm `repr_layers` semantics: 0..N, negatives count from the end (-1 = N, -(N+1) = 0)."""
    out = []
    for k in layers:
        if not -(num_layers + 1) <= int(k) <= num_layers:
            raise UsageError(f"layer {k} does not exist: this model has layers 0..{num_layers} "
                             f"(0 = embeddings, {num_layers} = last)",
                             fix=f"use a value in {-(num_layers + 1)}..{num_layers}; -1 is the last layer")
        k = (int(k) + num_layers + 1) % (num_layers + 1)
        if k not in out:
            out.append(k)
    return tuple(out)


def rotary_tables(cfg: Config, length: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [length, head_dim] for positions 0..length-1, rotate-half layout."""
    inv_freq = inverse_frequencies(cfg)
    angles = np.arange(length, dtype=np.float32)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def inverse_frequencies(cfg: Config) -> np.ndarray:
    d = cfg.head_dim
    return (1.0 / cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d))).astype(np.float32)


def _constant(like, array: np.ndarray):
    """`array` as a constant of the graph being traced, or as itself when the model runs eagerly on numpy."""
    return like.graph.constant(array) if getattr(like, "symbolic", False) else array


def forward(w, ids, mask, *, cfg: Config, layers: tuple[int, ...]):
    """ids: int32 [B, T] (<cls> residues <eos> <pad>...); mask: float32 [B, T], 1 for real tokens.
    Returns {"layer_k": [B, T, hidden]} for each k in `layers` (already resolved, 0..N)."""
    B, T = ids.shape
    H, D, N = cfg.num_attention_heads, cfg.head_dim, cfg.num_hidden_layers
    token_mask = mask.reshape(B, T, 1)

    x = ops.embedding(w["embeddings.word_embeddings.weight"], ids)
    if cfg.token_dropout:
        # <mask> embeddings are zeroed, and the rest scaled by (1 - train ratio) / (1 - observed ratio).
        is_mask = np.zeros((cfg.vocab_size, 1), np.float32)
        is_mask[cfg.mask_token_id] = 1.0
        masked = ops.embedding(_constant(ids, is_mask), ids)  # [B, T, 1]
        x = x * (1.0 - masked)
        observed = ops.div(ops.mean(masked, axis=1, keepdims=True), ops.mean(token_mask, axis=1, keepdims=True))
        x = x * ops.div(_constant(ids, np.float32(1 - MASK_RATIO_TRAIN)), 1.0 - observed)
    if cfg.emb_layer_norm_before:
        x = ops.layer_norm(x, w["embeddings.layer_norm.weight"], w["embeddings.layer_norm.bias"],
                           eps=cfg.layer_norm_eps)
    x = x * token_mask
    outputs = {"layer_0": x} if 0 in layers else {}

    bias = ((1.0 - mask) * float(ops.NEG_INF)).reshape(B, 1, 1, T)  # padding is never attended
    cos, sin = (_constant(ids, t) for t in rotary_tables(cfg, T))

    def heads(t):
        return t.reshape(B, T, H, D).transpose(0, 2, 1, 3)

    for i in range(N):
        p = f"encoder.layer.{i}."
        h = ops.layer_norm(x, w[p + "attention.LayerNorm.weight"], w[p + "attention.LayerNorm.bias"],
                           eps=cfg.layer_norm_eps)
        q, k, v = (heads(ops.linear(h, w[p + f"attention.self.{n}.weight"], w[p + f"attention.self.{n}.bias"]))
                   for n in ("query", "key", "value"))
        q, k = ops.rotary(q, cos, sin), ops.rotary(k, cos, sin)
        a = ops.attention(q, k, v, bias, scale=1 / math.sqrt(D)).transpose(0, 2, 1, 3).reshape(B, T, H * D)
        x = x + ops.linear(a, w[p + "attention.output.dense.weight"], w[p + "attention.output.dense.bias"])
        h = ops.layer_norm(x, w[p + "LayerNorm.weight"], w[p + "LayerNorm.bias"], eps=cfg.layer_norm_eps)
        h = ops.gelu(ops.linear(h, w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"]))
        x = x + ops.linear(h, w[p + "output.dense.weight"], w[p + "output.dense.bias"])
        if i + 1 == N:
            x = ops.layer_norm(x, w["encoder.emb_layer_norm_after.weight"], w["encoder.emb_layer_norm_after.bias"],
                               eps=cfg.layer_norm_eps)
        if i + 1 in layers:
            outputs[f"layer_{i + 1}"] = x
    return outputs


def entry(batch: int, length: int) -> str:
    """The entry name of the encoder at one static (batch, length)."""
    return f"esm_b{batch}_t{length}"


def graph(cfg: Config, batch: int, length: int, layers=(-1,)) -> Graph:
    """The encoder at one static (batch, length), returning the hidden states of `layers` (fair-esm
    semantics, negatives allowed)."""
    layers = resolve_layers(layers, cfg.num_hidden_layers)
    spec = ((batch, length), "int32")
    return trace(forward, name=entry(batch, length), weights=param_shapes(cfg), cfg=cfg, layers=layers,
                 inputs={"ids": spec, "mask": ((batch, length), "float32")})


# ---- the programs the pipeline runs (pipelines/protein.py, kernels/build.py and apps/bench.py take them here) ---

def length_buckets(max_tokens: int) -> tuple[int, ...]:
    """Token lengths (<cls> + residues + <eos>) a protein is padded to: powers of two from 64 below the longest
    allowed input, then that input itself. The default 1022 residues give 64, 128, 256, 512, 1024."""
    # powers of two keep the shapes tile-aligned on the NPU and the padding under 2x; they go on past 1024 so a
    # raised max_len does not pad every long protein to max_len itself
    steps, b = [], 64
    while b < max_tokens:
        steps.append(b)
        b *= 2
    return (*steps, max_tokens)


def batch_sizes(length: int, toks_per_batch: int) -> tuple[int, ...]:
    """The static batches at one length: a full batch of toks_per_batch // length rows, and a single sequence."""
    return tuple(sorted({1, max(1, toks_per_batch // length)}))


def program_graphs(cfg: Config, layers: tuple[int, ...], max_tokens: int, toks_per_batch: int) -> list[Graph]:
    """Every graph of one embedding session: each length bucket at each of its batch sizes."""
    return [graph(cfg, b, t, layers) for t in length_buckets(max_tokens) for b in batch_sizes(t, toks_per_batch)]


_LEGACY_NORM = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}


def _modern_name(key: str) -> str:
    for old, new in _LEGACY_NORM.items():
        if key.endswith(old):
            return key[:-len(old)] + new
    return key


def load(folder: str | Path) -> tuple[Config, dict[str, np.ndarray]]:
    folder = Path(folder)
    cfg = Config.from_dict(read_config(folder))
    # transformers 5 saves layer norms named `LayerNorm` as gamma/beta and reads both spellings; so do we.
    ckpt = {_modern_name(k): v for k, v in read_safetensors(folder / "model.safetensors").items()}
    weights = map_weights(ckpt, WEIGHT_MAP, param_shapes(cfg), ignore=IGNORED, source=str(folder),
                          prefixes=("esm.", ""))
    ours = inverse_frequencies(cfg)
    for key in (k for k in ckpt if k.endswith("rotary_embeddings.inv_freq")):
        theirs = np.asarray(ckpt[key], np.float32)
        if theirs.shape != ours.shape or not np.allclose(theirs, ours, rtol=1e-3):
            raise WeightError(f"{folder}: {key} does not match rotary embeddings with theta {cfg.rope_theta} and "
                              f"head size {cfg.head_dim}",
                              fix="check that config.json belongs to this checkpoint (rope_theta, hidden size, heads)")
    return cfg, weights
