"""The model registry: `model_type` from a checkpoint's config.json -> the module that implements it.

Each module is one architecture family: Config, param_shapes, WEIGHT_MAP, graph functions, load, TINY.
"""
from __future__ import annotations

from importlib import import_module
from types import ModuleType

from ..errors import UsageError

ARCHITECTURES: dict[str, str] = {
    "bert": "sdk.models.bert",
    "vit": "sdk.models.vit", "dinov2": "sdk.models.vit", "dinov2_with_registers": "sdk.models.vit",
    "clip": "sdk.models.clip", "resnet": "sdk.models.resnet",
    "esm": "sdk.models.esm",
    "parakeet_ctc": "sdk.models.conformer", "parakeet_tdt": "sdk.models.conformer",
    "parakeet_rnnt": "sdk.models.conformer", "gigaam": "sdk.models.conformer",
    "whisper": "sdk.models.whisper",
}


def module_for(model_type: str) -> ModuleType:
    if model_type not in ARCHITECTURES:
        raise UsageError(f"unsupported architecture {model_type!r}",
                         fix=f"supported model_type values: {', '.join(sorted(ARCHITECTURES))}")
    return import_module(ARCHITECTURES[model_type])
