"""Vision transformers: ViT, DINOv2 (layer scale, optional register tokens) and the CLIP vision tower.

All three are pre-LN encoders over [CLS] + patch tokens; they differ in a few places, which `Config.variant`
selects:
                 ViT                      DINOv2                          CLIP vision
  embeddings     cls + pos                cls + pos (+ registers)         cls + pos, then pre_layrnorm
  layer          x + attn, x + mlp         x + ls1*attn, x + ls2*mlp       x + attn, x + mlp (quick_gelu)
  output         layernorm, classifier    layernorm, pooled = CLS         hidden; pooled = post_layernorm(CLS),
                 on CLS (if trained)                                      embeds = visual_projection(pooled)

References: transformers' modeling_vit.py (ViTModel / ViTForImageClassification), modeling_dinov2.py
(Dinov2Model), modeling_dinov2_with_registers.py, modeling_clip.py (CLIPVisionTransformer). Our weight names
are theirs, with ViT's `vit.` prefix dropped (CLIP keeps `vision_model.`: its text tower shares the weight
set). Input: pixels float32 [B, 3, S, S], normalised by the preprocessor.
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

VARIANTS = {"vit": "vit", "dinov2": "dinov2", "dinov2_with_registers": "dinov2", "clip_vision_model": "clip"}
# transformers' config defaults where they differ from ViT's (a saved config.json may leave defaults out)
_DEFAULTS = {"dinov2": dict(layer_norm_eps=1e-6, patch_size=14, mlp_ratio=4),
             "clip": dict(hidden_act="quick_gelu", layer_norm_eps=1e-5, patch_size=32)}


# The image-classification heads of each variant, as transformers names them, and what each classifies:
#   ViT: the CLS token after the final layernorm; DINOv2 (with or without registers): CLS beside the mean of the
#   patch tokens, both after the layernorm; CLIP: the mean of the patch tokens before post_layernorm.
HEADS = {"vit": ("ViTForImageClassification",),
         "dinov2": ("Dinov2ForImageClassification", "Dinov2WithRegistersForImageClassification"),
         "clip": ("CLIPForImageClassification",)}
# Architectures whose weights are the bare tower (no head, or one that does not classify, which is ignored).
TOWERS = ("ViTModel", "Dinov2Model", "Dinov2WithRegistersModel", "CLIPModel", "CLIPVisionModel",
          "CLIPVisionModelWithProjection", "ViTForMaskedImageModeling")


def _classification_head(d: dict, variant: str) -> bool:
    """Whether the checkpoint carries a classification head we run; a head we do not run is a UsageError."""
    for arch in d.get("architectures") or ():
        if arch in HEADS[variant]:
            return True
        if arch not in TOWERS:
            raise UsageError(f"the {arch} head is not supported (vit.py runs {', '.join(HEADS[variant])})",
                             fix="use one of those checkpoints, or ImageEmbedder for the tower's embeddings")
    return False


@dataclass(frozen=True)
class Config:
    variant: str = "vit"             # vit | dinov2 | clip
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072    # DINOv2 derives it from mlp_ratio
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    image_size: int = 224            # the size the position embeddings were trained at
    patch_size: int = 16
    num_channels: int = 3
    qkv_bias: bool = True
    num_register_tokens: int = 0     # DINOv2 with registers
    num_labels: int = 0              # a classification head (*ForImageClassification); 0 = none
    projection_dim: int = 0          # CLIP: visual_projection output size (0: a classification checkpoint)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        model_type = d.get("model_type", "vit")
        if model_type == "clip":  # a whole CLIP checkpoint: the vision tower's part
            classifier = "CLIPForImageClassification" in (d.get("architectures") or ())
            return cls.from_dict({**d["vision_config"], "model_type": "clip_vision_model",
                                  "architectures": d.get("architectures"), "id2label": d.get("id2label"),
                                  "projection_dim": 0 if classifier else d.get("projection_dim", 512)})
        if model_type not in VARIANTS:
            raise UsageError(f"vit.py does not implement model_type {model_type!r}",
                             fix=f"supported: {', '.join(sorted(VARIANTS))}, clip")
        if d.get("use_swiglu_ffn"):
            raise UsageError("DINOv2 with a SwiGLU MLP (giant) is not supported", fix="use dinov2-small/base/large")
        d = {**_DEFAULTS.get(VARIANTS[model_type], {}), **d}
        known = known_fields(cls, d)
        known["variant"] = VARIANTS[model_type]
        if known["variant"] == "dinov2":
            known["intermediate_size"] = int(d.get("hidden_size", 768) * d.get("mlp_ratio", 4))
        known["num_labels"] = len(d.get("id2label") or {}) if _classification_head(d, known["variant"]) else 0
        return cls(**known)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size


TINY = {
    "vit": Config("vit", hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  image_size=32, patch_size=8, num_labels=10),
    "dinov2": Config("dinov2", hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                     layer_norm_eps=1e-6, image_size=32, patch_size=8, num_register_tokens=0),
    "clip": Config("clip", hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                   hidden_act="quick_gelu", layer_norm_eps=1e-5, image_size=32, patch_size=8, projection_dim=16),
}


def _quick_gelu(x):
    return x * ops.sigmoid(ops.scale(x, factor=1.702))


_ACT = {"gelu": ops.gelu, "gelu_new": ops.gelu_tanh, "gelu_pytorch_tanh": ops.gelu_tanh, "quick_gelu": _quick_gelu,
        "relu": ops.relu}

# Per variant: the names of the pieces that differ (embeddings, per-layer modules, final norms).
_NAMES = {
    "vit": dict(layers="encoder.layer", ln1="layernorm_before", ln2="layernorm_after",
                q="attention.attention.query", k="attention.attention.key", v="attention.attention.value",
                o="attention.output.dense", fc1="intermediate.dense", fc2="output.dense"),
    "dinov2": dict(layers="encoder.layer", ln1="norm1", ln2="norm2",
                   q="attention.attention.query", k="attention.attention.key", v="attention.attention.value",
                   o="attention.output.dense", fc1="mlp.fc1", fc2="mlp.fc2"),
    "clip": dict(layers="encoder.layers", ln1="layer_norm1", ln2="layer_norm2",
                 q="self_attn.q_proj", k="self_attn.k_proj", v="self_attn.v_proj",
                 o="self_attn.out_proj", fc1="mlp.fc1", fc2="mlp.fc2"),
}


_PREFIX = {"vit": "", "dinov2": "", "clip": "vision_model."}


def param_shapes(cfg: Config) -> dict[str, tuple]:
    h, f, c, p, n = cfg.hidden_size, cfg.intermediate_size, cfg.num_channels, cfg.patch_size, cfg.grid ** 2
    nm = _NAMES[cfg.variant]
    if cfg.variant == "clip":
        shapes = {"embeddings.class_embedding": (h,), "embeddings.patch_embedding.weight": (h, c, p, p),
                  "embeddings.position_embedding.weight": (n + 1, h),
                  "pre_layrnorm.weight": (h,), "pre_layrnorm.bias": (h,),
                  "post_layernorm.weight": (h,), "post_layernorm.bias": (h,)}
        if cfg.projection_dim:
            shapes["visual_projection.weight"] = (cfg.projection_dim, h)
    else:
        shapes = {"embeddings.cls_token": (1, 1, h), "embeddings.position_embeddings": (1, n + 1, h),
                  "embeddings.patch_embeddings.projection.weight": (h, c, p, p),
                  "embeddings.patch_embeddings.projection.bias": (h,),
                  "layernorm.weight": (h,), "layernorm.bias": (h,)}
        if cfg.num_register_tokens:
            shapes["embeddings.register_tokens"] = (1, cfg.num_register_tokens, h)
    if cfg.num_labels:
        width = 2 * h if cfg.variant == "dinov2" else h
        shapes |= {"classifier.weight": (cfg.num_labels, width), "classifier.bias": (cfg.num_labels,)}
    for i in range(cfg.num_hidden_layers):
        pre = f"{nm['layers']}.{i}."
        for key in ("ln1", "ln2"):
            shapes |= {pre + nm[key] + ".weight": (h,), pre + nm[key] + ".bias": (h,)}
        for key in ("q", "k", "v", "o"):
            shapes[pre + nm[key] + ".weight"] = (h, h)
            if cfg.qkv_bias or key == "o":
                shapes[pre + nm[key] + ".bias"] = (h,)
        shapes |= {pre + nm["fc1"] + ".weight": (f, h), pre + nm["fc1"] + ".bias": (f,),
                   pre + nm["fc2"] + ".weight": (h, f), pre + nm["fc2"] + ".bias": (h,)}
        if cfg.variant == "dinov2":
            shapes |= {pre + "layer_scale1.lambda1": (h,), pre + "layer_scale2.lambda1": (h,)}
    heads = ("visual_projection.", "classifier.")
    return {(k if k.startswith(heads) else _PREFIX[cfg.variant] + k): v for k, v in shapes.items()}


# (our name, checkpoint name). A *ForImageClassification checkpoint nests the tower under its attribute name
# ({tower}: "vit.", "dinov2.", "dinov2_with_registers."), with the head beside it; CLIP keeps its names as they are.
WEIGHT_MAP = [("classifier.{name}", "classifier.{name}"), ("{name}", "{tower}{name}")]
TOWER_PREFIXES = ("vit.", "dinov2.", "dinov2_with_registers.")
IGNORED = [r"^(vit\.)?pooler\.", r"mask_token$", r"^text_model\.", r"^text_projection\.", r"^logit_scale$",
           r"position_ids$"]


def interpolation_matrix(n_in: int, n_out: int, antialias: bool) -> np.ndarray:
    """[n_out, n_in] weights of PyTorch's 1-D bicubic resize (align_corners=False): Keys a=-0.75 with clamped
    borders, or with `antialias` the separable PIL-style filter (a=-0.5, support widened when shrinking)."""
    def cubic(t, a):
        t = np.abs(t)
        return np.where(t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1,
                        np.where(t < 2, (((t - 5) * t + 8) * t - 4) * a, 0.0))
    scale = n_in / n_out
    m = np.zeros((n_out, n_in), np.float64)
    for i in range(n_out):
        if antialias:
            support = 2.0 * max(scale, 1.0)
            center = (i + 0.5) * scale
            lo, hi = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), n_in)
            w = cubic((np.arange(lo, hi) - center + 0.5) / max(scale, 1.0), -0.5)
            m[i, lo:hi] = w / w.sum()
        else:
            src = (i + 0.5) * scale - 0.5
            base = math.floor(src)
            for k, w in zip(range(base - 1, base + 3), cubic(np.arange(base - 1, base + 3) - src, -0.75)):
                m[i, min(max(k, 0), n_in - 1)] += w
    return m.astype(np.float32)


def forward(w, pixels, *, cfg: Config):
    """pixels float32 [B, C, S, S] (already normalised) -> dict of outputs (see the module docstring)."""
    B, _, S, _ = pixels.shape
    h, H, D, nm = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, _NAMES[cfg.variant]
    grid = S // cfg.patch_size
    prefix = _PREFIX[cfg.variant]

    def W(name):  # the tower's weights carry the checkpoint's prefix when the checkpoint holds two towers
        return w[prefix + name]

    if cfg.variant == "clip":
        patches = ops.conv2d(pixels, W("embeddings.patch_embedding.weight"), None, stride=cfg.patch_size)
        cls = W("embeddings.class_embedding").reshape(1, 1, h)
        pos = W("embeddings.position_embedding.weight").reshape(1, cfg.grid ** 2 + 1, h)
    else:
        patches = ops.conv2d(pixels, W("embeddings.patch_embeddings.projection.weight"),
                             W("embeddings.patch_embeddings.projection.bias"), stride=cfg.patch_size)
        cls, pos = W("embeddings.cls_token"), W("embeddings.position_embeddings")
    patches = patches.reshape(B, h, grid * grid).transpose(0, 2, 1)
    if grid != cfg.grid:  # DINOv2 runs at other sizes: resample the trained position grid (a fixed linear map)
        if cfg.variant != "dinov2":
            raise UsageError(f"{cfg.variant} needs {cfg.image_size}x{cfg.image_size} input, got {S}x{S}")
        m1 = interpolation_matrix(cfg.grid, grid, antialias=cfg.num_register_tokens > 0)
        resize = pos.graph.constant(np.kron(m1, m1))
        pos = ops.concat([pos[:, :1], ops.matmul(resize, pos[0, 1:]).reshape(1, grid * grid, h)], axis=1)
    x = ops.concat([ops.concat([cls] * B, axis=0) if B > 1 else cls, patches], axis=1) + pos
    if cfg.num_register_tokens:
        regs = W("embeddings.register_tokens")
        x = ops.concat([x[:, :1], ops.concat([regs] * B, axis=0) if B > 1 else regs, x[:, 1:]], axis=1)
    if cfg.variant == "clip":
        x = ops.layer_norm(x, W("pre_layrnorm.weight"), W("pre_layrnorm.bias"), eps=cfg.layer_norm_eps)
    T, act = x.shape[1], _ACT[cfg.hidden_act]

    def heads(t):
        return t.reshape(B, T, H, D).transpose(0, 2, 1, 3)

    def lin(t, name):
        return ops.linear(t, W(name + ".weight"), W(name + ".bias") if prefix + name + ".bias" in w else None)

    def norm(t, name):
        return ops.layer_norm(t, W(name + ".weight"), W(name + ".bias"), eps=cfg.layer_norm_eps)

    for i in range(cfg.num_hidden_layers):
        p = f"{nm['layers']}.{i}."
        y = norm(x, p + nm["ln1"])
        q, k, v = (heads(lin(y, p + nm[n])) for n in ("q", "k", "v"))
        a = ops.attention(q, k, v, None, scale=1 / math.sqrt(D)).transpose(0, 2, 1, 3).reshape(B, T, h)
        a = lin(a, p + nm["o"])
        x = x + (a * W(p + "layer_scale1.lambda1") if cfg.variant == "dinov2" else a)
        y = lin(act(lin(norm(x, p + nm["ln2"]), p + nm["fc1"])), p + nm["fc2"])
        x = x + (y * W(p + "layer_scale2.lambda1") if cfg.variant == "dinov2" else y)

    if cfg.variant == "clip":
        pooled = norm(x[:, 0], "post_layernorm")
        out = {"hidden": x, "pooled": pooled}
        if cfg.projection_dim:
            out["embeds"] = ops.linear(pooled, w["visual_projection.weight"])
        head_input = ops.mean(x[:, 1:], axis=1) if cfg.num_labels else None
    else:
        x = norm(x, "layernorm")
        out = {"hidden": x, "pooled": x[:, 0]}
        patches = x[:, 1 + cfg.num_register_tokens:]
        head_input = x[:, 0] if cfg.variant == "vit" else ops.concat([x[:, 0], ops.mean(patches, axis=1)], axis=1)
    if cfg.num_labels:
        out["logits"] = ops.linear(head_input, w["classifier.weight"], w["classifier.bias"])
    return out


def entry(batch: int, size: int) -> str:
    return f"image_b{batch}_s{size}"


def graph(cfg: Config, batch: int, size: int | None = None) -> Graph:
    """The tower at one static batch and square image size (default: the trained size)."""
    size = size or cfg.image_size
    if size % cfg.patch_size:
        raise UsageError(f"image size {size} is not a multiple of the patch size {cfg.patch_size}")
    return trace(forward, name=entry(batch, size), weights=param_shapes(cfg), cfg=cfg,
                 inputs={"pixels": ((batch, cfg.num_channels, size, size), "float32")})


def load(folder: str | Path) -> tuple[Config, dict[str, np.ndarray]]:
    folder = Path(folder)
    cfg = Config.from_dict(read_config(folder))
    ckpt = read_safetensors(folder / "model.safetensors")
    tower = next((p for p in TOWER_PREFIXES if any(k.startswith(p) for k in ckpt)), "")
    table = [(ours, theirs.replace("{tower}", tower)) for ours, theirs in WEIGHT_MAP]
    ignore = IGNORED + ([r"^classifier\."] if not cfg.num_labels else [])
    weights = map_weights(ckpt, table, param_shapes(cfg), ignore=ignore, source=str(folder))
    return cfg, weights
