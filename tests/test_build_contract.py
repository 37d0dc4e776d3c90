"""The build (kernels/build.py) and the npu runtime (sdk/runtime/npu.py) agree on the artifact contract.

No toolchain is installed here, so tests/fake_toolchain.py stands in for it (Peano's clang++ and aiecc as small
scripts taking the flags the build passes, writing files of the right kinds and names where the real tools would).

Then, per target: sdk.runtime.npu_artifacts.find_artifact(program) (its dispatches as the watchdog pass split
them) finds and sha-verifies every required role of what the build recorded, and NpuBackend against the fake pyxrt loads that program from the built files
and runs it (EMULATED: outputs equal the emu backend's). Nothing here touches an NPU or the real toolchain.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kernels import build as kbuild
from sdk import smoke
from sdk.compiler import compile as compile_graphs
from sdk.compiler import watchdog
from sdk.errors import ArtifactMissing
from sdk.runtime import npu, npu_artifacts
from sdk.runtime.emu import EmuBackend

from . import fake_pyxrt, fake_toolchain
from .conftest import FIXTURES
from .test_designs import SYNTH_WEIGHTS, synthetic_graph
from .test_npu_backend import fake_npu  # noqa: F401  (the fixture: a fake Ryzen AI laptop)

TARGETS = ("npu1", "npu2")


@pytest.fixture
def toolchain(tmp_path, monkeypatch) -> kbuild.Toolchain:
    with fake_toolchain.installed(tmp_path / "toolchain", monkeypatch) as fake:
        yield fake


def _synthetic_budget(program) -> float:
    """A dispatch budget that splits the synthetic graph's single dispatch into a few (NAME.0, NAME.1, ...)."""
    step = next(s for e in program.entries.values() for s in e.steps if s.kind == "dispatch")
    fixed = watchdog.dispatch_seconds(program, step) - sum(watchdog.kernel_seconds(program, k) for k in step.body)
    biggest = max(watchdog.kernel_seconds(program, k) for k in step.body)
    return 1.001 * max(watchdog.dispatch_seconds(program, step) / 3, fixed + biggest)


def _dispatches(program) -> list[str]:
    return [s.op for e in program.entries.values() for s in e.steps if s.kind == "dispatch"]


def _check_artifact(program, prebuilt: Path, budget_s=None) -> npu_artifacts.Artifact:
    """What the runtime finds for `program`: every required role present, under prebuilt/, sha-verified."""
    device = watchdog.split_dispatches(program, budget_s)
    artifact = npu_artifacts.find_artifact(device)
    assert artifact.key == program.meta["content_key"] and artifact.target == program.target
    assert list(artifact.files) == npu_artifacts.required_roles(device)
    for path in artifact.files.values():
        assert path.parent == prebuilt / program.target / artifact.key
    if program.target == "npu1":
        assert len(artifact.files) == 1 + len(_dispatches(device))
    else:
        assert [artifact.sequence(d) for d in _dispatches(device)] == [npu_artifacts.sequence_name(d) for d in
                                                                       _dispatches(device)]
    return artifact


@pytest.mark.parametrize("target", TARGETS)
def test_built_smoke_artifact_is_found_and_runs(fake_npu, toolchain, target):  # noqa: F811
    """`aie-apps build smoke --target T` (kernels/build.py main) makes what the doctor's smoke dispatch loads."""
    prebuilt = fake_npu(target)
    assert kbuild.main(["smoke", "--target", target, "--out", str(prebuilt)]) == 0
    program = compile_graphs([smoke.smoke_graph()], target)  # compiled again: the key is deterministic
    _check_artifact(program, prebuilt)
    assert "dispatch on " + target in smoke.smoke_dispatch(target)  # the doctor's check, against the fake pyxrt
    assert fake_pyxrt.FAKE.dispatches == ["smoke#0"]


@pytest.mark.parametrize("target", TARGETS)
def test_built_split_program_is_found_and_runs_like_emu(fake_npu, toolchain, target):  # noqa: F811
    """A graph using every design, its dispatch split to fit a watchdog budget: one runtime sequence (npu2) /
    instruction stream (npu1) per split dispatch, found by the runtime and run in order with emu's results."""
    prebuilt = fake_npu(target)
    program = compile_graphs([synthetic_graph()], target)
    budget = _synthetic_budget(program)
    assert len(_dispatches(watchdog.split_dispatches(program, budget))) > len(_dispatches(program)) == 1
    entry = kbuild.build_program(program, "synthetic", prebuilt, toolchain, budget)
    assert entry["key"] == program.meta["content_key"]
    assert npu_artifacts.read_manifest(prebuilt / "manifest.json")[entry["key"]]["files"] == entry["files"]
    _check_artifact(program, prebuilt, budget)

    rng = np.random.default_rng(0)
    weights = {n: rng.normal(0, 0.2, s).astype(np.float32) for n, s in SYNTH_WEIGHTS.items()}
    inputs = {"x": rng.normal(size=(1, 16, 64)), "img": rng.normal(size=(1, 3, 16, 16)),
              "seq": rng.normal(size=(1, 16, 20)), "last": rng.normal(size=(1, 64))}
    inputs = {n: v.astype(np.float32) for n, v in inputs.items()} | {"length": np.int32(11)}
    exe = npu.NpuBackend(target).load(watchdog.split_dispatches(program, budget), weights)
    try:
        ours = exe.run(None, inputs)
    finally:
        exe.close()
    ref = EmuBackend(target).load(program, weights).run(None, inputs)
    assert set(ours) == set(ref)
    for name in ref:
        np.testing.assert_array_equal(ours[name], ref[name], err_msg=name)
    assert fake_pyxrt.FAKE.dispatches == _dispatches(watchdog.split_dispatches(program, budget))


@pytest.mark.parametrize("target", TARGETS)
def test_bert_fixture_builds_in_full_and_is_recorded(toolchain, tmp_path, target):
    """Every kernel step of the BERT fixture has a design (kernels/README.md, the counts): its build goes through
    the fused design and the (fake) aiecc, and the manifest records it under the program's content key."""
    entry = kbuild.build(str(FIXTURES / "bert"), target, tmp_path / "prebuilt", toolchain)
    recorded = npu_artifacts.read_manifest(tmp_path / "prebuilt" / "manifest.json")
    assert list(recorded) == [entry["key"]] and recorded[entry["key"]]["target"] == target
    assert all((tmp_path / "prebuilt" / f["path"]).is_file() for f in recorded[entry["key"]]["files"].values())


def test_a_rebuild_replaces_its_entry_and_keeps_the_others(toolchain, tmp_path):
    prebuilt = tmp_path / "prebuilt"
    first = {t: kbuild.build("smoke", t, prebuilt, toolchain)["key"] for t in TARGETS}
    again = kbuild.build("smoke", "npu2", prebuilt, toolchain)["key"]
    assert again == first["npu2"]
    assert {k: a["target"] for k, a in npu_artifacts.read_manifest(prebuilt / "manifest.json").items()} == \
        {first["npu1"]: "npu1", first["npu2"]: "npu2"}


def test_committed_manifest_reads_with_the_runtime_reader(monkeypatch):
    monkeypatch.setattr(npu_artifacts, "prebuilt_dirs", lambda: [npu_artifacts.PREBUILT])
    assert npu_artifacts.read_manifests() == [(npu_artifacts.PREBUILT, {})]
    assert npu_artifacts.artifact_keys("npu1") == npu_artifacts.artifact_keys("npu2") == []


@pytest.mark.parametrize("doc", [{"format": 1, "artifacts": []}, {"artifacts": {}},
                                 {"format": 1, "artifacts": {"k": {"target": "npu2", "files": []}}}])
def test_a_manifest_of_another_shape_is_a_typed_error(tmp_path, doc):
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ArtifactMissing, match="not a format-1 manifest") as e:
        npu_artifacts.read_manifest(tmp_path / "manifest.json")
    assert "aie-apps build" in e.value.fix


def test_manifest_entry_refuses_files_that_do_not_match_the_program(tmp_path):
    program = watchdog.split_dispatches(compile_graphs([smoke.smoke_graph()], "npu1"))
    (tmp_path / "final.xclbin").write_bytes(b"x")
    with pytest.raises(Exception, match=r"missing \['insts/smoke#0'\]"):
        npu_artifacts.manifest_entry(program, tmp_path, {"xclbin": tmp_path / "final.xclbin"})
