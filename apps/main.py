"""Entry point of `aie-apps`: importing a command module registers its command on the app."""
from __future__ import annotations

from . import doctor, embed_text, info  # noqa: F401  (registration)
from . import dictate  # noqa: F401
from . import embed  # noqa: F401
from . import build  # noqa: F401
from . import classify  # noqa: F401
from . import transcribe  # noqa: F401
from . import bench  # noqa: F401
from . import models  # noqa: F401
from .cli import app

__all__ = ["app"]

if __name__ == "__main__":
    app()
