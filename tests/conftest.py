"""Shared test setup: offline always; `reference` tests need torch, `npu` tests need the hardware.

The suite passes on a Ryzen AI machine too: a test that needs "no NPU" asks for the `no_npu` fixture. To run it
as it would run there without one, `pytest --fake-npu npu2` (or npu1) fakes the NPU present for every other test:
its PCI id and device node, tests/fake_pyxrt.py as pyxrt, and the doctor's smoke artifact built, so that
device="auto" picks the NPU as on a set-up machine (and falls back when a model has no artifact)."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["AIE_APPS_OFFLINE"] = "1"

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_addoption(parser):
    parser.addoption("--fake-npu", choices=("npu1", "npu2"), default=None,
                     help="run as on a Ryzen AI machine of this generation: NPU detection faked present, the fake "
                          "pyxrt, the doctor's smoke artifact built (tests that need no NPU still fake its absence)")


@pytest.fixture
def no_npu(monkeypatch, tmp_path):
    """This machine has no NPU, whatever it really has: no NPU on the PCI bus, no device node, and auto's one
    fallback warning not yet given."""
    from sdk import runtime
    from sdk.runtime import checks
    monkeypatch.setattr(checks, "SYSFS_PCI", tmp_path / "no-npu" / "sys")
    monkeypatch.setattr(checks, "DEVICE_NODES", str(tmp_path / "no-npu" / "accel*"))
    monkeypatch.setattr(runtime, "_warned", False)


@pytest.fixture(autouse=True)
def _fake_ryzen_ai(request):
    """With --fake-npu TARGET: every test that neither fakes the absence (no_npu) nor its own machine (fake_npu)
    runs on a faked Ryzen AI machine of that generation, set up as `aie-apps doctor` wants it."""
    target = request.config.getoption("--fake-npu")
    if target is None or {"no_npu", "fake_npu"} & set(request.fixturenames):
        yield
        return
    from sdk import compiler, smoke
    from . import fake_pyxrt
    tmp, monkeypatch = request.getfixturevalue("tmp_path") / "ryzen-ai", request.getfixturevalue("monkeypatch")
    fake_pyxrt.install_machine(tmp, monkeypatch)
    fake_pyxrt.plug(tmp, target)
    fake_pyxrt.reset(target=target)
    fake_pyxrt.write_artifacts(compiler.compile([smoke.smoke_graph()], target), tmp / "prebuilt")
    if "npu" in request.keywords:   # the acceptance suite builds what it lacks: with the fake toolchain here
        from . import fake_toolchain
        with fake_toolchain.installed(tmp / "toolchain", monkeypatch):
            yield
    else:
        yield
    fake_pyxrt.reset()


@pytest.fixture(autouse=True)
def _npu_programs_built_on_demand(request, monkeypatch):
    """`pytest -m npu` on a Ryzen AI machine: a test program that no prebuilt/ folder holds (the op and model cases
    are no user's model) is first built with the installed toolchain (kernels/build.py) into a folder of this test
    session. tests/test_npu_contract.py checks what `aie-apps build` built, so it gets nothing built for it."""
    if "npu" not in request.keywords or request.module.__name__.endswith("test_npu_contract"):
        yield
        return
    from kernels import build as kbuild
    from sdk.errors import ArtifactMissing
    from sdk.runtime import npu, npu_artifacts
    folder = request.getfixturevalue("tmp_path_factory").getbasetemp() / "npu-test-programs"
    dirs, load = npu_artifacts.prebuilt_dirs, npu.NpuBackend.load
    monkeypatch.setattr(npu_artifacts, "prebuilt_dirs", lambda: [*dirs(), folder])

    def load_building_first(backend, program, weights):
        try:
            npu_artifacts.find_artifact(program)
        except ArtifactMissing:
            kbuild.build_program(program, f"pytest {request.node.nodeid}", folder, kbuild.find_toolchain(),
                                 program.meta["watchdog"]["budget_s"])
        return load(backend, program, weights)
    monkeypatch.setattr(npu.NpuBackend, "load", load_building_first)
    yield


def pytest_collection_modifyitems(config, items):
    from sdk.runtime import npu_problem
    no_torch = importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None
    npu = "" if config.getoption("--fake-npu") else npu_problem()
    for item in items:
        if no_torch and "reference" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="needs the `reference` extra: pip install -e '.[reference]'"))
        if npu and "npu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=f"needs a Ryzen AI NPU: {npu}"))
        elif "npu" in item.keywords and item.module.__name__.endswith("test_npu_contract") and \
                config.getoption("--fake-npu"):
            item.add_marker(pytest.mark.skip(reason="runs what `aie-apps build --all` built on the machine; its "
                                                    "fake counterpart is test_built_artifacts_are_what_the_command_loads"))


def parity(ours: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(max-abs, relative-L2) of ours against the reference; tests print them so the numbers are on record."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, f"shape {ours.shape} != reference {ref.shape}"
    max_abs = float(np.abs(ours - ref).max()) if ours.size else 0.0
    rel_l2 = float(np.linalg.norm(ours - ref) / max(np.linalg.norm(ref), 1e-30))
    return max_abs, rel_l2


@pytest.fixture
def record_result(request, record_property, capsys):
    """Call with (line, **numbers): a measured result (a WER, a preprocessing error, the fuzz counts). The
    numbers go to the JUnit properties always, the line into the terminal with -v or -s (`pytest -q` stays
    quiet)."""
    config = request.config
    show = config.getoption("verbose") > 0 or config.getoption("capture") == "no"

    def record(line: str, **numbers):
        for key, value in numbers.items():
            record_property(key, value)
        if show:
            with capsys.disabled():
                print(f"\n  {line}", end="")
    return record


@pytest.fixture
def record_parity(record_result):
    """Call with (label, ours, ref); returns (max_abs, rel_l2), recorded as record_result does."""
    def record(label, ours, ref):
        max_abs, rel_l2 = parity(ours, ref)
        record_result(f"parity {label}: max-abs {max_abs:.3g}  rel-L2 {rel_l2:.3g}",
                      **{f"{label}.max_abs": max_abs, f"{label}.rel_l2": rel_l2})
        return max_abs, rel_l2
    return record
