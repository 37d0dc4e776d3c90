"""Which voice activity detector a dictation session runs: silero-vad when installed, else the energy VAD."""
from __future__ import annotations

import warnings

from sdk.errors import ModelNotFound
from sdk.runtime import FallbackWarning

from .options import DictationOptions
from .silero_vad import INSTALL, SileroVad, silero_model_path
from .vad import Vad


class VadFallbackWarning(FallbackWarning):
    """vad="auto" runs the energy VAD because silero-vad is not installed; the message says how to get it."""


def check_vad(options: DictationOptions) -> None:
    """vad="silero" is strict: ModelNotFound when silero-vad is not installed (before any model loads)."""
    if options.vad == "silero" and silero_model_path() is None:
        raise ModelNotFound("silero-vad is not installed (--vad silero)",
                            fix=f"`{INSTALL}`, or use the energy VAD: --vad energy")


def open_vad(options: DictationOptions) -> Vad | SileroVad:
    """The detector `options.vad` asks for (not called for vad=None). "silero" is strict (see check_vad);
    "auto" falls back to the energy VAD with one warning per process."""
    check_vad(options)
    if options.vad == "energy":
        return Vad(options)
    if options.vad == "auto" and silero_model_path() is None:
        warnings.warn("silero-vad is not installed: voice activity comes from the energy VAD, which misses more"
                      f" speech in noise and starts on music (`{INSTALL}` to use it)", VadFallbackWarning, stacklevel=2)
        return Vad(options)
    return SileroVad(options)


def vad_name(vad) -> str:
    """The detector's name for reports: silero, energy or off."""
    return "silero" if isinstance(vad, SileroVad) else "energy" if isinstance(vad, Vad) else "off"
