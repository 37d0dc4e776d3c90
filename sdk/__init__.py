"""aie-apps SDK: whole model graphs on the AMD Ryzen AI NPU, and on the CPU where there is none.

    from sdk import TextEmbedder, Transcriber, ImageClassifier, ImageEmbedder, ProteinEmbedder, Session

Importing this package never touches hardware. The pipeline classes are re-exported lazily from
`pipelines` (the one sanctioned upward import), so `import sdk` stays light.
"""
from __future__ import annotations

from importlib import import_module

__version__ = "0.1.0"

_LAZY = {
    "Session": "sdk.session",
    "TextEmbedder": "pipelines.text",
    "Transcriber": "pipelines.asr",
    "ImageClassifier": "pipelines.vision",
    "ImageEmbedder": "pipelines.vision",
    "ProteinEmbedder": "pipelines.protein",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sdk' has no attribute {name!r}")
