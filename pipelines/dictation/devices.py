"""Audio input devices through PortAudio (sounddevice): listing, and picking one by index or name."""
from __future__ import annotations

from dataclasses import dataclass

from sdk.errors import DeviceIOError


@dataclass(frozen=True)
class InputDevice:
    index: int
    name: str
    hostapi: str
    channels: int
    default_samplerate: float
    is_default: bool


def load_sounddevice():
    try:
        import sounddevice
    except OSError as e:  # the PortAudio shared library is missing
        raise DeviceIOError(f"cannot load PortAudio: {e}",
                            fix="install PortAudio (Debian/Ubuntu: sudo apt install libportaudio2)") from None
    return sounddevice


def list_input_devices() -> list[InputDevice]:
    """Input-capable devices, one entry per name (the same device shows up once per host API), default marked."""
    sd = load_sounddevice()
    try:
        devices, hostapis = sd.query_devices(), sd.query_hostapis()
        default_in = sd.default.device[0]
    except sd.PortAudioError as e:
        raise DeviceIOError(f"cannot list audio devices: {e}", fix="check that the sound system is running") from None
    if default_in is None or default_in < 0:
        default_in = next((h["default_input_device"] for h in hostapis if h["default_input_device"] >= 0), -1)
    found: dict[str, InputDevice] = {}
    for index, d in enumerate(devices):
        if d["max_input_channels"] <= 0:
            continue
        dev = InputDevice(index, d["name"], hostapis[d["hostapi"]]["name"], d["max_input_channels"],
                          float(d["default_samplerate"]), index == default_in)
        key = d["name"].strip().lower()
        if key not in found or (dev.is_default and not found[key].is_default):
            found[key] = dev
    return sorted(found.values(), key=lambda dev: dev.index)


def find_input_device(spec: int | str | None) -> InputDevice:
    """None = the default input; an int (or digits) = that PortAudio index; text = case-insensitive substring."""
    devices = list_input_devices()
    names = ", ".join(f"{d.index}: {d.name}" for d in devices) or "none"
    list_fix = "run `aie-apps dictate --list-devices` and pass --input-device INDEX or part of a name"
    if not devices:
        raise DeviceIOError("no microphone (audio input device) found",
                            fix="plug in a microphone, or check that PulseAudio/PipeWire is running and this user may use audio")
    if spec is None or spec == "":
        return next((d for d in devices if d.is_default), devices[0])
    if isinstance(spec, int) or str(spec).strip().isdigit():
        index = int(spec)
        match = next((d for d in devices if d.index == index), None)
        if match is None:
            raise DeviceIOError(f"audio input device {index} does not exist or has no input channels (inputs: {names})",
                                fix=list_fix)
        return match
    matches = [d for d in devices if str(spec).lower() in d.name.lower()]
    if not matches:
        raise DeviceIOError(f"no audio input device matches {spec!r} (inputs: {names})", fix=list_fix)
    return matches[0]
