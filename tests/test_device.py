"""Device choice is made in one place: auto falls back with one warning, npu is strict."""
from __future__ import annotations

import warnings

import pytest

from sdk import runtime
from sdk.errors import DeviceUnavailable, UsageError


def test_auto_falls_back_to_cpu_once_with_the_reason(no_npu):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = runtime.choose_device("auto")
        second = runtime.choose_device("auto")
    assert (first.effective, second.effective) == ("cpu", "cpu")
    assert first.reason and first.reason == runtime.npu_problem()
    assert [type(w.message) for w in caught] == [runtime.DeviceFallbackWarning]


def test_npu_is_strict_and_unknown_devices_are_usage_errors(no_npu):
    with pytest.raises(DeviceUnavailable) as e:
        runtime.choose_device("npu")
    assert e.value.exit_code == 3 and "doctor" in e.value.fix
    with pytest.raises(UsageError):
        runtime.choose_device("tpu")


def test_default_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("AIE_APPS_DEVICE", "cpu")
    assert runtime.choose_device(None) == runtime.DeviceChoice("cpu", "cpu")
    monkeypatch.setenv("AIE_APPS_DEVICE", "bogus")
    with pytest.raises(UsageError, match=r"unknown device 'bogus' \(from AIE_APPS_DEVICE\)"):
        runtime.choose_device(None)
    with pytest.raises(UsageError) as e:  # an explicit choice names no variable
        runtime.choose_device("tpu")
    assert "unknown device 'tpu'" in str(e.value) and "AIE_APPS_DEVICE" not in str(e.value)
