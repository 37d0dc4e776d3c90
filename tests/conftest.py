"""Shared test setup: offline always; `reference` tests need torch, `npu` tests need the hardware."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["AIE_APPS_OFFLINE"] = "1"

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_collection_modifyitems(config, items):
    from sdk.runtime import npu_problem
    no_torch = importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None
    npu = npu_problem()
    for item in items:
        if no_torch and "reference" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="needs the `reference` extra: pip install -e '.[reference]'"))
        if npu and "npu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=f"needs a Ryzen AI NPU: {npu}"))


def parity(ours: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(max-abs, relative-L2) of ours against the reference; tests print them so the numbers are on record."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, f"shape {ours.shape} != reference {ref.shape}"
    max_abs = float(np.abs(ours - ref).max()) if ours.size else 0.0
    rel_l2 = float(np.linalg.norm(ours - ref) / max(np.linalg.norm(ref), 1e-30))
    return max_abs, rel_l2


@pytest.fixture
def record_parity(request, record_property, capsys):
    """Call with (label, ours, ref); returns (max_abs, rel_l2). The numbers go to the JUnit properties always,
    and into the terminal with -v or -s (`pytest -q` stays quiet)."""
    config = request.config
    show = config.getoption("verbose") > 0 or config.getoption("capture") == "no"

    def record(label, ours, ref):
        max_abs, rel_l2 = parity(ours, ref)
        record_property(f"{label}.max_abs", max_abs)
        record_property(f"{label}.rel_l2", rel_l2)
        if show:
            with capsys.disabled():
                print(f"\n  parity {label}: max-abs {max_abs:.3g}  rel-L2 {rel_l2:.3g}", end="")
        return max_abs, rel_l2
    return record
