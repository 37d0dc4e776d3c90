"""ResNet (ResNet-18/34 basic blocks, ResNet-50/101/152 bottlenecks) in the microsoft/resnet-* layout.

Stem: 7x7/2 conv + BN + ReLU, 3x3/2 max pool. Stages of residual layers (the first layer of a stage may
stride and project its shortcut with a 1x1 conv + BN), global average pool, linear classifier.
Batch norm is folded into the preceding convolution once at load (inference statistics are constants), so
the graph is conv(+bias) -> relu only: W' = W * g / sqrt(var + eps), b' = beta - mean * g / sqrt(var + eps).

Reference: transformers' modeling_resnet.py (ResNetForImageClassification). Our names are theirs without
`resnet.`; a folded conv is `<layer>.convolution.{weight,bias}`. Input: pixels float32 [B, 3, S, S].
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import ops
from ..errors import UsageError
from ..graph import Graph, trace
from ..weights import known_fields, map_weights, read_config, read_safetensors

BN_EPS = 1e-5  # torch.nn.BatchNorm2d's default, which transformers' ResNet uses


@dataclass(frozen=True)
class Config:
    num_channels: int = 3
    embedding_size: int = 64
    hidden_sizes: tuple[int, ...] = (256, 512, 1024, 2048)
    depths: tuple[int, ...] = (3, 4, 6, 3)
    layer_type: str = "bottleneck"   # basic | bottleneck
    hidden_act: str = "relu"
    downsample_in_first_stage: bool = False
    downsample_in_bottleneck: bool = False
    num_labels: int = 0              # 0 = backbone only (ResNetModel)
    image_size: int = 224            # not in the checkpoint config: the preprocessor's crop size

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        if d.get("hidden_act", "relu") != "relu":
            raise UsageError(f"ResNet with activation {d['hidden_act']!r} is not supported", fix="use a relu ResNet")
        known = known_fields(cls, d)
        known = {k: tuple(v) if isinstance(v, list) else v for k, v in known.items()}
        classifier = any(a.endswith("ForImageClassification") for a in d.get("architectures") or ())
        known["num_labels"] = len(d.get("id2label") or {}) if classifier else 0
        return cls(**known)


TINY = Config(embedding_size=8, hidden_sizes=(8, 16, 24, 32), depths=(2, 2, 2, 2), layer_type="basic",
              num_labels=10, image_size=64)


def _blocks(cfg: Config):
    """(name, in_channels, out_channels, stride) of every residual layer, in order."""
    ins = (cfg.embedding_size,) + cfg.hidden_sizes[:-1]
    for s, (cin, cout, depth) in enumerate(zip(ins, cfg.hidden_sizes, cfg.depths)):
        stride = 2 if s > 0 or cfg.downsample_in_first_stage else 1
        for layer in range(depth):
            yield f"encoder.stages.{s}.layers.{layer}", (cin if layer == 0 else cout), cout, \
                (stride if layer == 0 else 1)


def _convs(cfg: Config):
    """(name, out, in, kernel, stride) of every conv+BN pair: the unit that folding works on."""
    yield "embedder.embedder", cfg.embedding_size, cfg.num_channels, 7, 2
    for name, cin, cout, stride in _blocks(cfg):
        if cin != cout or stride != 1:
            yield f"{name}.shortcut", cout, cin, 1, stride
        if cfg.layer_type == "basic":
            yield f"{name}.layer.0", cout, cin, 3, stride
            yield f"{name}.layer.1", cout, cout, 3, 1
        else:
            mid, first = cout // 4, cfg.downsample_in_bottleneck
            yield f"{name}.layer.0", mid, cin, 1, stride if first else 1
            yield f"{name}.layer.1", mid, mid, 3, 1 if first else stride
            yield f"{name}.layer.2", cout, mid, 1, 1


def _head(cfg: Config) -> dict[str, tuple]:
    return {"classifier.1.weight": (cfg.num_labels, cfg.hidden_sizes[-1]), "classifier.1.bias": (cfg.num_labels,)}


def checkpoint_shapes(cfg: Config) -> dict[str, tuple]:
    """What the checkpoint holds: conv weights and batch-norm statistics."""
    shapes = {}
    for name, cout, cin, k, _ in _convs(cfg):
        shapes[f"{name}.convolution.weight"] = (cout, cin, k, k)
        for stat in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{name}.normalization.{stat}"] = (cout,)
    if cfg.num_labels:
        shapes |= _head(cfg)
    return shapes


def param_shapes(cfg: Config) -> dict[str, tuple]:
    """What the graph reads: folded convs with biases."""
    shapes = {}
    for name, cout, cin, k, _ in _convs(cfg):
        shapes |= {f"{name}.convolution.weight": (cout, cin, k, k), f"{name}.convolution.bias": (cout,)}
    if cfg.num_labels:
        shapes |= _head(cfg)
    return shapes


WEIGHT_MAP = [("classifier.{name}", "classifier.{name}"), ("{name}", "resnet.{name}")]
IGNORED = [r"num_batches_tracked$"]


def fold_batch_norm(weights: dict[str, np.ndarray], cfg: Config) -> dict[str, np.ndarray]:
    """Checkpoint weights -> graph weights: every BN folded into its conv (float64 while folding)."""
    out = {k: v for k, v in weights.items() if k.startswith("classifier.")}
    for name, *_ in _convs(cfg):
        bn = {s: weights[f"{name}.normalization.{s}"].astype(np.float64)
              for s in ("weight", "bias", "running_mean", "running_var")}
        g = bn["weight"] / np.sqrt(bn["running_var"] + BN_EPS)
        conv = weights[f"{name}.convolution.weight"]
        out[f"{name}.convolution.weight"] = (conv * g[:, None, None, None]).astype(np.float32)
        out[f"{name}.convolution.bias"] = (bn["bias"] - bn["running_mean"] * g).astype(np.float32)
    return out


def forward(w, pixels, *, cfg: Config):
    """pixels float32 [B, C, S, S] -> {"features": [B, C_last] pooled, "logits": [B, labels] if a head}."""
    def conv(x, name, stride, relu=True):
        wt = w[f"{name}.convolution.weight"]
        y = ops.conv2d(x, wt, w[f"{name}.convolution.bias"], stride=stride, padding=wt.shape[-1] // 2)
        return ops.relu(y) if relu else y

    x = conv(pixels, "embedder.embedder", 2)
    x = ops.max_pool2d(x, kernel=3, stride=2, padding=1)
    convs = {name: stride for name, _, _, _, stride in _convs(cfg)}
    n_convs = 2 if cfg.layer_type == "basic" else 3
    for name, cin, cout, stride in _blocks(cfg):
        shortcut = conv(x, f"{name}.shortcut", stride, relu=False) if f"{name}.shortcut" in convs else x
        y = x
        for j in range(n_convs):
            y = conv(y, f"{name}.layer.{j}", convs[f"{name}.layer.{j}"], relu=j < n_convs - 1)
        x = ops.relu(y + shortcut)
    features = ops.mean(x, axis=(2, 3))
    out = {"features": features}
    if cfg.num_labels:
        out["logits"] = ops.linear(features, w["classifier.1.weight"], w["classifier.1.bias"])
    return out


def entry(batch: int, size: int) -> str:
    return f"image_b{batch}_s{size}"


def graph(cfg: Config, batch: int, size: int | None = None) -> Graph:
    size = size or cfg.image_size
    return trace(forward, name=entry(batch, size), weights=param_shapes(cfg), cfg=cfg,
                 inputs={"pixels": ((batch, cfg.num_channels, size, size), "float32")})


def load(folder: str | Path) -> tuple[Config, dict[str, np.ndarray]]:
    folder = Path(folder)
    cfg = Config.from_dict(read_config(folder))
    ckpt = read_safetensors(folder / "model.safetensors")
    table = WEIGHT_MAP if any(k.startswith("resnet.") for k in ckpt) else [("{name}", "{name}")]
    weights = map_weights(ckpt, table, checkpoint_shapes(cfg), ignore=IGNORED, source=str(folder))
    return cfg, fold_batch_norm(weights, cfg)
