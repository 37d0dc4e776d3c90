"""CLIP: the text tower and the projections; the vision tower is vit.py's `clip` variant.

Text tower: token + position embeddings, pre-LN causal transformer (quick_gelu), final layer norm, the hidden
state at each sequence's end-of-text token, then `text_projection`. Image-text logits are the cosine
similarities of the projected embeddings times exp(logit_scale).

Reference: transformers' modeling_clip.py (CLIPModel, CLIPTextTransformer). Weight names are CLIPModel's
(`text_model.*`, `text_projection.weight`, `logit_scale`; the vision tower's `vision_model.*`).
Graphs: `text_b{B}_t{T}` (ids, mask, eos -> embeds), `image_b{B}_s{S}` (vit.py), `similarity_i{I}_t{N}`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import ops
from ..errors import UsageError
from ..graph import Graph, trace
from ..weights import known_fields, map_weights, read_config, read_safetensors
from . import vit


@dataclass(frozen=True)
class TextConfig:
    vocab_size: int = 49408
    hidden_size: int = 512
    intermediate_size: int = 2048
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    max_position_embeddings: int = 77
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 1
    bos_token_id: int = 49406
    eos_token_id: int = 49407

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class Config:
    text: TextConfig
    vision: vit.Config
    projection_dim: int = 512

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        if d.get("model_type") != "clip":
            raise UsageError(f"clip.py needs a CLIP checkpoint (model_type 'clip'), got {d.get('model_type')!r}")
        t = d.get("text_config") or {}
        text = TextConfig(**known_fields(TextConfig, t))
        return cls(text, vit.Config.from_dict(d), d.get("projection_dim", 512))


TINY = Config(TextConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=16, pad_token_id=1, bos_token_id=98,
                         eos_token_id=99),
              vit.TINY["clip"], projection_dim=16)


def param_shapes(cfg: Config) -> dict[str, tuple]:
    t, h, f = cfg.text, cfg.text.hidden_size, cfg.text.intermediate_size
    shapes = {"text_model.embeddings.token_embedding.weight": (t.vocab_size, h),
              "text_model.embeddings.position_embedding.weight": (t.max_position_embeddings, h),
              "text_model.final_layer_norm.weight": (h,), "text_model.final_layer_norm.bias": (h,),
              "text_projection.weight": (cfg.projection_dim, h), "logit_scale": (1,)}
    for i in range(t.num_hidden_layers):
        p = f"text_model.encoder.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes |= {p + f"self_attn.{n}.weight": (h, h), p + f"self_attn.{n}.bias": (h,)}
        for n in ("layer_norm1", "layer_norm2"):
            shapes |= {p + f"{n}.weight": (h,), p + f"{n}.bias": (h,)}
        shapes |= {p + "mlp.fc1.weight": (f, h), p + "mlp.fc1.bias": (f,),
                   p + "mlp.fc2.weight": (h, f), p + "mlp.fc2.bias": (h,)}
    return shapes | vit.param_shapes(cfg.vision)


WEIGHT_MAP = [("{name}", "{name}")]  # CLIPModel names as they are
IGNORED = [r"position_ids$"]


def eos_positions(ids: np.ndarray, cfg: TextConfig) -> np.ndarray:
    """Where each row's pooled token is, by transformers' rule: the first end-of-text token, or for old
    configs that say eos_token_id == 2, the largest id (the end-of-text token is the largest in CLIP's vocab)."""
    ids = np.asarray(ids)
    if cfg.eos_token_id == 2:
        return ids.argmax(axis=-1).astype(np.int32)
    return (ids == cfg.eos_token_id).argmax(axis=-1).astype(np.int32)


def text_forward(w, ids, mask, eos, *, cfg: Config):
    """ids int32 [B, T]; mask float32 [B, T] (1 = token, 0 = padding); eos int32 [B] (see eos_positions)."""
    t = cfg.text
    B, T = ids.shape
    H, D, h = t.num_attention_heads, t.head_dim, t.hidden_size
    x = ops.embedding(w["text_model.embeddings.token_embedding.weight"], ids)
    x = x + w["text_model.embeddings.position_embedding.weight"][:T]
    causal = np.triu(np.full((T, T), ops.NEG_INF, np.float32), k=1)
    bias = ids.graph.constant(causal) + ((1.0 - mask) * float(ops.NEG_INF)).reshape(B, 1, 1, T)

    def heads(y):
        return y.reshape(B, T, H, D).transpose(0, 2, 1, 3)

    def lin(y, name):
        return ops.linear(y, w[name + ".weight"], w[name + ".bias"])

    def norm(y, name):
        return ops.layer_norm(y, w[name + ".weight"], w[name + ".bias"], eps=t.layer_norm_eps)

    for i in range(t.num_hidden_layers):
        p = f"text_model.encoder.layers.{i}."
        y = norm(x, p + "layer_norm1")
        q, k, v = (heads(lin(y, p + f"self_attn.{n}_proj")) for n in "qkv")
        a = ops.attention(q, k, v, bias, scale=1 / math.sqrt(D)).transpose(0, 2, 1, 3).reshape(B, T, h)
        x = x + lin(a, p + "self_attn.out_proj")
        y = lin(vit._ACT[t.hidden_act](lin(norm(x, p + "layer_norm2"), p + "mlp.fc1")), p + "mlp.fc2")
        x = x + y
    x = norm(x, "text_model.final_layer_norm")
    rows = ops.add(eos, ids.graph.constant(np.arange(B) * T))  # flat index of each row's end-of-text token
    pooled = ops.embedding(x.reshape(B * T, h), rows)
    return {"hidden": x, "pooled": pooled, "embeds": ops.linear(pooled, w["text_projection.weight"])}


def _unit(x):
    """x / ||x|| along the last axis, as rms_norm with weights 1/sqrt(dim): x / sqrt(sum x^2)."""
    d = x.shape[-1]
    return ops.rms_norm(x, x.graph.constant(np.full(d, 1 / math.sqrt(d), np.float32)), eps=0.0)


def similarity_forward(w, image_embeds, text_embeds):
    """logits_per_image [I, N] = exp(logit_scale) * cos(image, text)."""
    logits = ops.matmul(_unit(image_embeds), _unit(text_embeds), transpose_b=True)
    return {"logits_per_image": logits * ops.exp(w["logit_scale"]),
            "image_embeds": _unit(image_embeds), "text_embeds": _unit(text_embeds)}


def text_entry(batch: int, length: int) -> str:
    return f"text_b{batch}_t{length}"


def image_entry(cfg: Config, batch: int) -> str:
    return vit.entry(batch, cfg.vision.image_size)


def similarity_entry(images: int, texts: int) -> str:
    return f"similarity_i{images}_t{texts}"


def text_graph(cfg: Config, batch: int, length: int | None = None) -> Graph:
    length = length or cfg.text.max_position_embeddings
    if length > cfg.text.max_position_embeddings:
        raise UsageError(f"text length {length} exceeds {cfg.text.max_position_embeddings} positions")
    return trace(text_forward, name=text_entry(batch, length), weights=param_shapes(cfg), cfg=cfg,
                 inputs={"ids": ((batch, length), "int32"), "mask": ((batch, length), "float32"),
                         "eos": ((batch,), "int32")})


def image_graph(cfg: Config, batch: int) -> Graph:
    return vit.graph(cfg.vision, batch)


def similarity_graph(cfg: Config, images: int, texts: int) -> Graph:
    p = cfg.projection_dim
    return trace(similarity_forward, name=similarity_entry(images, texts), weights=param_shapes(cfg),
                 inputs={"image_embeds": ((images, p), "float32"), "text_embeds": ((texts, p), "float32")})


def load(folder: str | Path) -> tuple[Config, dict[str, np.ndarray]]:
    folder = Path(folder)
    cfg = Config.from_dict(read_config(folder))
    ckpt = read_safetensors(folder / "model.safetensors")
    shapes = param_shapes(cfg) | {"logit_scale": ()}  # a scalar in the checkpoint, [1] in the graph
    weights = map_weights(ckpt, WEIGHT_MAP, shapes, ignore=IGNORED, source=str(folder))
    weights["logit_scale"] = weights["logit_scale"].reshape(1)
    return cfg, weights
