"""BERT family encoders (BERT, MiniLM, BGE-style): token + position + token-type embeddings, post-LN layers,
exact GELU, padding mask. Checkpoints: Hugging Face `BertModel` safetensors (with or without `bert.`).

Reference: transformers' modeling_bert.py (BertModel). Output: last hidden state [B, T, hidden].
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import ops
from ..graph import Graph, trace
from ..weights import known_fields, map_weights, read_config, read_safetensors


@dataclass(frozen=True)
class Config:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        return cls(**known_fields(cls, d))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


TINY = Config(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
              max_position_embeddings=64, type_vocab_size=2)

_ACT = {"gelu": ops.gelu, "gelu_new": ops.gelu_tanh, "gelu_pytorch_tanh": ops.gelu_tanh, "relu": ops.relu}


def param_shapes(cfg: Config) -> dict[str, tuple]:
    h, f = cfg.hidden_size, cfg.intermediate_size
    shapes = {
        "embeddings.word_embeddings.weight": (cfg.vocab_size, h),
        "embeddings.position_embeddings.weight": (cfg.max_position_embeddings, h),
        "embeddings.token_type_embeddings.weight": (cfg.type_vocab_size, h),
        "embeddings.LayerNorm.weight": (h,), "embeddings.LayerNorm.bias": (h,),
    }
    for i in range(cfg.num_hidden_layers):
        p = f"encoder.layer.{i}."
        for proj in ("query", "key", "value"):
            shapes[p + f"attention.self.{proj}.weight"] = (h, h)
            shapes[p + f"attention.self.{proj}.bias"] = (h,)
        shapes |= {p + "attention.output.dense.weight": (h, h), p + "attention.output.dense.bias": (h,),
                   p + "attention.output.LayerNorm.weight": (h,), p + "attention.output.LayerNorm.bias": (h,),
                   p + "intermediate.dense.weight": (f, h), p + "intermediate.dense.bias": (f,),
                   p + "output.dense.weight": (h, f), p + "output.dense.bias": (h,),
                   p + "output.LayerNorm.weight": (h,), p + "output.LayerNorm.bias": (h,)}
    return shapes


# Our names are transformers' BertModel names; the table says so row by row.
WEIGHT_MAP = [
    ("embeddings.{name}", "embeddings.{name}"),
    ("encoder.layer.{i}.{name}", "encoder.layer.{i}.{name}"),
]
# Keys a BertModel checkpoint carries that an encoder does not use.
IGNORED = [r"position_ids$", r"^pooler\.", r"^cls\.", r"^bert\.pooler\."]


def forward(w, ids, token_types, mask, *, cfg: Config):
    """ids, token_types: int32 [B, T]; mask: float32 [B, T], 1 for real tokens, 0 for padding."""
    B, T = ids.shape
    H, D = cfg.num_attention_heads, cfg.head_dim
    x = ops.embedding(w["embeddings.word_embeddings.weight"], ids)
    x = x + w["embeddings.position_embeddings.weight"][:T]
    x = x + ops.embedding(w["embeddings.token_type_embeddings.weight"], token_types)
    x = ops.layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps=cfg.layer_norm_eps)
    bias = ((1.0 - mask) * float(ops.NEG_INF)).reshape(B, 1, 1, T)  # padding never attended
    act = _ACT[cfg.hidden_act]

    def heads(t):
        return t.reshape(B, T, H, D).transpose(0, 2, 1, 3)

    for i in range(cfg.num_hidden_layers):
        p = f"encoder.layer.{i}."
        q, k, v = (heads(ops.linear(x, w[p + f"attention.self.{n}.weight"], w[p + f"attention.self.{n}.bias"]))
                   for n in ("query", "key", "value"))
        a = ops.attention(q, k, v, bias, scale=1 / math.sqrt(D)).transpose(0, 2, 1, 3).reshape(B, T, H * D)
        a = ops.linear(a, w[p + "attention.output.dense.weight"], w[p + "attention.output.dense.bias"])
        x = ops.layer_norm(a + x, w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"],
                           eps=cfg.layer_norm_eps)
        f = act(ops.linear(x, w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"]))
        f = ops.linear(f, w[p + "output.dense.weight"], w[p + "output.dense.bias"])
        x = ops.layer_norm(f + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"],
                           eps=cfg.layer_norm_eps)
    return {"hidden": x}


def entry(batch: int, length: int) -> str:
    """The entry name of the encoder at one static (batch, length)."""
    return f"forward_b{batch}_t{length}"


def graph(cfg: Config, batch: int, length: int) -> Graph:
    """The encoder at one static (batch, length)."""
    if length > cfg.max_position_embeddings:
        raise ValueError(f"length {length} exceeds max_position_embeddings {cfg.max_position_embeddings}")
    spec = ((batch, length), "int32")
    return trace(forward, name=entry(batch, length), weights=param_shapes(cfg), cfg=cfg,
                 inputs={"ids": spec, "token_types": spec, "mask": ((batch, length), "float32")})


# ---- the programs the pipelines run (pipelines/text.py, kernels/build.py and apps/bench.py all take them here) --

def length_buckets(cfg: Config, max_length: int, buckets: tuple[int, ...]) -> tuple[int, ...]:
    """The padded lengths a text is run at: the buckets below the longest allowed input, then that length."""
    top = min(max_length, cfg.max_position_embeddings)
    return tuple(b for b in buckets if b < top) + (top,)


def batch_sizes(batch_size: int) -> tuple[int, ...]:
    """A single text runs at batch 1; anything more in batches of batch_size (the last one padded)."""
    return tuple(sorted({1, batch_size}))


def program_graphs(cfg: Config, batch_size: int, max_length: int, buckets: tuple[int, ...]) -> list[Graph]:
    """Every graph of one text-embedding session: each batch size at each length bucket."""
    return [graph(cfg, b, t) for b in batch_sizes(batch_size) for t in length_buckets(cfg, max_length, buckets)]


def load(folder: str | Path) -> tuple[Config, dict[str, np.ndarray]]:
    folder = Path(folder)
    cfg = Config.from_dict(read_config(folder))
    ckpt = read_safetensors(folder / "model.safetensors")
    weights = map_weights(ckpt, WEIGHT_MAP, param_shapes(cfg), ignore=IGNORED, source=str(folder),
                          prefixes=("bert.", ""))
    return cfg, weights

