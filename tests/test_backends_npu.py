"""The backend conformance suite (tests/test_backends.py) on the npu backend over the fake pyxrt, for npu1
and npu2: every op's case, compared with its numpy reference at the suite's tolerance, and with the emu
backend bit for bit (the fake executes dispatches with the emulator's semantics). Emulated, not hardware:
the suite's `npu` row runs the same cases on a real NPU."""
from __future__ import annotations

import numpy as np
import pytest

from sdk.session import Session

from .test_backends import CASES, TOL, _build, _reference
from .test_npu_backend import build, fake_npu  # noqa: F401  (the fixture)


@pytest.mark.parametrize("target", ["npu1", "npu2"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_op_on_npu_backend_matches_reference_and_emu(fake_npu, name, target, record_parity):  # noqa: F811
    prebuilt = fake_npu(target)
    g, weights, inputs, initial = _build(name)
    expected = _reference(name, weights, inputs, initial)
    build([g], target, prebuilt)
    outs = {}
    for device in ("npu", "emu"):
        with Session([g], weights, device=device, target=target) as s:
            state = s.new_state()
            for n, a in initial.items():
                state.buffers[n][...] = a
            outs[device] = np.asarray(s.run(state=state, **inputs)["out"])
            if device == "npu":
                assert s.device_effective == "npu" and s.counters.dispatches >= 1
    assert np.array_equal(outs["npu"], outs["emu"])
    out = outs["npu"]
    assert out.shape == expected.shape
    if expected.dtype.kind != "f":
        assert np.array_equal(out, expected)
        return
    finite = np.isfinite(expected) & (np.abs(expected) < 1e29)
    _, rel = record_parity(f"{name}.npu-{target}(fake)", out[finite], expected[finite])
    assert rel <= TOL
