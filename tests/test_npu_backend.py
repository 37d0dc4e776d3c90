"""The npu backend against tests/fake_pyxrt.py, a pyxrt that enforces XRT's contract (stale host memory
without a sync, opcode 3, word counts, context and buffer limits, memlock, watchdog) and executes every
dispatch with the emulator's semantics. Everything here is EMULATED: no NPU is touched. The tests marked
`npu` at the end run the same cases on a real Ryzen AI NPU and skip elsewhere, saying why."""
from __future__ import annotations

import dataclasses
import fcntl
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from sdk import compiler, runtime, smoke
from sdk.compiler import watchdog
from sdk.errors import (ArtifactMissing, ContextLimit, DeviceBusy, DeviceUnavailable, DispatchTimeout,
                        MemlockTooLow, ProgramError, UsageError)
from sdk.runtime import checks, npu, npu_lock
from sdk.runtime.emu import EmuBackend
from sdk.session import Session

from . import fake_pyxrt
from .fake_pyxrt import FROM_DEVICE, TO_DEVICE, ContractViolation
from .test_emu import CASES, COVERS, TOL

@pytest.fixture
def fake_npu(monkeypatch, tmp_path):
    """machine(target, **limits) -> the prebuilt/ folder of a fake Ryzen AI laptop: PCI id in sysfs, a device
    node (whose flock is the NPU lock), pyxrt (the fake), memlock as the fake pins it."""
    prebuilt = fake_pyxrt.install_machine(tmp_path, monkeypatch)

    def machine(target="npu2", device_id=None, **world):
        fake_pyxrt.plug(tmp_path, target, device_id)
        fake_pyxrt.reset(target=target, **world)
        return prebuilt
    yield machine
    fake_pyxrt.reset()


def build(graphs, target, prebuilt, budget_s=None) -> str:
    """What `aie-apps build` does on a toolchain machine, with fake artifacts."""
    return fake_pyxrt.write_artifacts(compiler.compile(list(graphs), target), prebuilt, budget_s)


def _dispatch_steps(program, entry):
    return sum(1 for s in program.entry(entry).steps if s.kind == "dispatch")


# ---- every architecture: outputs equal to emu, one dispatch per run, weights synced once -------------------

def test_every_registered_architecture_runs_here():
    from sdk.models import ARCHITECTURES
    assert set(ARCHITECTURES) <= set(COVERS)


@pytest.mark.parametrize("target", ["npu1", "npu2"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_npu_equals_emu_one_dispatch_per_run_weights_synced_once(fake_npu, name, target):
    prebuilt = fake_npu(target)
    graphs, weights, runs = CASES[name]()
    build(graphs, target, prebuilt)
    with Session(graphs, weights, device="npu") as dev, Session(graphs, weights, device="emu", target=target) as emu:
        assert (dev.device_effective, dev.program.target) == ("npu", target)
        weights_bo = dev._exe._bos["weights"]
        uploaded = dev.counters.weight_bytes_to_device
        assert uploaded > 0 and weights_bo.syncs == [(TO_DEVICE, 0, uploaded)]
        state_dev, state_emu = dev.new_state(), emu.new_state()
        for entry, inputs in runs:
            dev.counters.reset()
            emu.counters.reset()
            ours, ref = dev.run(entry, state_dev, **inputs), emu.run(entry, state_emu, **inputs)
            # one dispatch per forward / per decoder token (a host op, where the compiler left one, adds one)
            assert dev.counters.dispatches == emu.counters.dispatches == _dispatch_steps(dev.program, entry)
            assert dev.counters.host_ops == emu.counters.host_ops
            if dev.counters.host_ops == 0:
                assert dev.counters.dispatches == 1
            assert dev.counters.weight_bytes_to_device == 0
            assert sorted(ours) == sorted(ref)
            for key in ref:
                assert np.array_equal(ours[key], ref[key]), (entry, key)
        assert weights_bo.syncs == [(TO_DEVICE, 0, uploaded)]  # exactly once per session
        assert fake_pyxrt.FAKE.contexts == 1
        del state_dev, weights_bo  # what the test itself still holds
    assert (fake_pyxrt.FAKE.contexts, fake_pyxrt.FAKE.pinned) == (0, 0)


def test_whisper_token_step_moves_only_its_inputs_and_logits(fake_npu):
    prebuilt = fake_npu("npu2")
    graphs, weights, runs = CASES["whisper"]()
    build(graphs, "npu2", prebuilt)
    with Session(graphs, weights, device="npu") as s:
        state = s.new_state()
        s.run("encode", state, **runs[0][1])
        logits_bytes = s.program.buffers[s.program.entry("decode_step").outputs["logits"]].nbytes
        for entry, inputs in runs[1:]:
            s.counters.reset()
            s.run(entry, state, **inputs)
            c = s.counters
            assert (c.dispatches, c.weight_bytes_to_device, c.host_ops) == (1, 0, 0)
            assert 8 <= c.bytes_to_device <= 8 + npu.SYNC_GAP  # token id + position (+ alignment padding)
            assert c.bytes_from_device == logits_bytes
    print(f"\n  whisper token on the npu backend (fake pyxrt): {c.bytes_to_device} B in, {c.bytes_from_device} B out,"
          f" {c.syncs} syncs", end="")


def test_one_weight_upload_serves_many_runs_and_states(fake_npu):
    prebuilt = fake_npu("npu1")
    graphs, weights, runs = CASES["bert"]()
    build(graphs, "npu1", prebuilt)
    with Session(graphs, weights, device="npu") as s:
        first = s.run(**runs[0][1])["hidden"]
        for _ in range(3):
            assert np.array_equal(s.run(**runs[0][1])["hidden"], first)
        assert len(s._exe._bos["weights"].syncs) == 1
        # instruction streams went to the device once, at load
        assert all(len(bo.syncs) == 1 for bo, _ in s._exe._insts.values())


# ---- the watchdog ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["npu1", "npu2"])
def test_a_dispatch_over_the_watchdog_is_split_and_still_matches(fake_npu, target):
    graphs, weights, runs = CASES["bert"]()
    program = compiler.compile(graphs, target)
    whole = watchdog.dispatch_seconds(program, program.entry(None).steps[0])
    budget = whole / 3
    prebuilt = fake_npu(target, watchdog_s=budget * 1.001)  # the device stops anything over the budget
    build(graphs, target, prebuilt, budget_s=budget)
    exe = npu.NpuBackend().load(watchdog.split_dispatches(program, budget), weights)
    try:
        out = exe.run(None, runs[0][1])["hidden"]
        chunks = [s for s in exe.program.entry(None).steps if s.kind == "dispatch"]
        assert exe.counters.dispatches == len(chunks) >= 3
        assert all(watchdog.dispatch_seconds(program, c) <= budget for c in chunks)
        assert (fake_pyxrt.FAKE.timeouts, fake_pyxrt.FAKE.runlists) == (0, 1)  # the chunks went as one batch
    finally:
        exe.close()
    ref = EmuBackend(target).load(program, weights).run(None, runs[0][1])["hidden"]
    assert np.array_equal(out, ref)


@pytest.mark.parametrize("target", ["npu1", "npu2"])
@pytest.mark.parametrize("fault,state", [("timeout", "TIMEOUT"), ("error", "ERROR")])
def test_a_split_dispatch_that_fails_is_a_typed_error(fake_npu, target, fault, state):
    """A runlist's own runs have no defined state in XRT: its wait() raises, naming the failed run's state."""
    graphs, weights, runs = CASES["bert"]()
    program = compiler.compile(graphs, target)
    budget = watchdog.dispatch_seconds(program, program.entry(None).steps[0]) / 3
    build(graphs, target, fake_npu(target), budget_s=budget)
    exe = npu.NpuBackend().load(watchdog.split_dispatches(program, budget), weights)
    try:
        fake_pyxrt.FAKE.faults.add(fault)
        with pytest.raises(DispatchTimeout, match=state) as e:
            exe.run(None, runs[0][1])
        assert e.value.exit_code == 3 and "doctor" in e.value.fix and fake_pyxrt.FAKE.runlists == 1
        fake_pyxrt.FAKE.faults.clear()
        exe.run(None, runs[0][1])  # the session survives a failed runlist
    finally:
        exe.close()


def test_an_unsplit_dispatch_over_the_watchdog_times_out_with_a_typed_error(fake_npu):
    graphs, weights, runs = CASES["bert"]()
    program = compiler.compile(graphs, "npu2")
    whole = watchdog.dispatch_seconds(program, program.entry(None).steps[0])
    prebuilt = fake_npu("npu2", watchdog_s=whole / 2)
    build(graphs, "npu2", prebuilt)  # planned for the real watchdog, which this device does not honour
    with Session(graphs, weights, device="npu") as s:
        with pytest.raises(DispatchTimeout, match="watchdog") as e:
            s.run(**runs[0][1])
    assert e.value.exit_code == 3 and e.value.fix and fake_pyxrt.FAKE.timeouts == 1
    assert f"estimated {whole * 1e3:.1f} ms" in e.value.message  # the compiler's estimate, from the program


def test_the_watchdog_plan_is_recorded_in_the_program_and_required(fake_npu):
    """The compiler's last pass plans every dispatch against the watchdog and records it; the runtime runs the
    steps it is given and refuses a program that was never planned (it would not know a dispatch fits)."""
    graphs, weights, _ = CASES["bert"]()
    program = compiler.compile(graphs, "npu2")
    plan = program.meta["watchdog"]
    assert plan["budget_s"] == watchdog.WATCHDOG_S * watchdog.WATCHDOG_MARGIN and plan["driver_s"] == watchdog.WATCHDOG_S
    assert plan["estimates_s"] == {s.op: watchdog.dispatch_seconds(program, s) for s in program.entry(None).steps}
    build(graphs, "npu2", fake_npu("npu2"))
    unplanned = dataclasses.replace(program, meta={k: v for k, v in program.meta.items() if k != "watchdog"})
    with pytest.raises(ProgramError, match="watchdog") as e:
        npu.NpuBackend().load(unplanned, weights)
    assert "compile" in e.value.fix and fake_pyxrt.FAKE.contexts == 0


# ---- faults -> typed errors, nothing left pinned or locked -------------------------------------------------

def _bert_on(fake_npu, target="npu2", **world):
    prebuilt = fake_npu(target, **world)
    graphs, weights, runs = CASES["bert"]()
    build(graphs, target, prebuilt)
    return graphs, weights, runs


@pytest.mark.parametrize("fault,error,words", [
    ("context", DeviceUnavailable, "hardware context"),
    ("busy", DeviceBusy, "busy"),
    ("alloc", DeviceUnavailable, "allocating"),
    ("device", DeviceUnavailable, "cannot open"),
])
def test_load_faults_are_typed_and_leave_nothing_behind(fake_npu, fault, error, words):
    graphs, weights, runs = _bert_on(fake_npu)
    fake_pyxrt.FAKE.faults.add(fault)
    with pytest.raises(error, match=words) as e:
        Session(graphs, weights, device="npu")
    assert type(e.value) is error and e.value.exit_code == 3 and e.value.fix
    assert (fake_pyxrt.FAKE.contexts, fake_pyxrt.FAKE.pinned, npu._Device.current) == (0, 0, None)
    fake_pyxrt.FAKE.faults.clear()  # the device works again: a new session opens (the lock was released)
    with Session(graphs, weights, device="npu") as s:
        s.run(**runs[0][1])


@pytest.mark.parametrize("fault,state", [("timeout", "TIMEOUT"), ("error", "ERROR")])
def test_a_run_that_times_out_or_fails_is_a_typed_error(fake_npu, fault, state):
    graphs, weights, runs = _bert_on(fake_npu)
    with Session(graphs, weights, device="npu") as s:
        fake_pyxrt.FAKE.faults.add(fault)
        with pytest.raises(DispatchTimeout, match=state) as e:
            s.run(**runs[0][1])
        assert "doctor" in e.value.fix
        fake_pyxrt.FAKE.faults.clear()
        s.run(**runs[0][1])  # the session survives a failed dispatch


def test_memlock_too_low_is_refused_before_pinning(fake_npu):
    graphs, weights, _ = _bert_on(fake_npu, memlock=64 * 1024)
    with pytest.raises(MemlockTooLow, match="memlock") as e:
        Session(graphs, weights, device="npu")
    assert "limits.d" in e.value.fix and fake_pyxrt.FAKE.pinned == 0


def test_hardware_context_limit_npu1(fake_npu):
    graphs, weights, runs = _bert_on(fake_npu, "npu1")
    sessions = [Session(graphs, weights, device="npu") for _ in range(npu.CONTEXT_LIMIT["npu1"])]
    try:
        with pytest.raises(ContextLimit, match="6") as e:
            Session(graphs, weights, device="npu")
        assert "close" in e.value.fix
        for s in sessions:  # the six that fit still run
            s.run(**runs[0][1])
    finally:
        for s in sessions:
            s.close()
    assert fake_pyxrt.FAKE.contexts == 0
    Session(graphs, weights, device="npu").close()


def test_contexts_held_by_other_programs_npu2(fake_npu):
    graphs, weights, _ = _bert_on(fake_npu, "npu2", other_contexts=16)
    with pytest.raises(ContextLimit, match="other programs"):
        Session(graphs, weights, device="npu")


def test_device_busy_when_another_process_holds_the_npu(fake_npu):
    graphs, weights, runs = _bert_on(fake_npu)
    fd = os.open(npu_lock.device_node(), os.O_RDONLY)  # another program: its own open file, its own lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(DeviceBusy, match=f"process {os.getpid()}") as e:
            Session(graphs, weights, device="npu")
        assert "--device cpu" in e.value.fix
        with warnings.catch_warnings(record=True) as caught:  # auto falls back instead
            warnings.simplefilter("always")
            with Session(graphs, weights, device="auto") as s:
                assert s.device_effective == "cpu" and "in use" in s.report()["fallback_reason"]
                s.run(**runs[0][1])
        assert [type(w.message) for w in caught] == [runtime.DeviceFallbackWarning]
    finally:
        os.close(fd)


def test_sessions_of_one_process_share_the_device(fake_npu):
    graphs, weights, runs = _bert_on(fake_npu)
    with Session(graphs, weights, device="npu") as a, Session(graphs, weights, device="npu") as b:
        assert a._exe._dev is b._exe._dev and fake_pyxrt.FAKE.contexts == 2
        assert np.array_equal(a.run(**runs[0][1])["hidden"], b.run(**runs[0][1])["hidden"])
        with pytest.raises(UsageError):
            a.run(state=b.new_state(), **runs[0][1])
    assert npu._Device.current is None


# ---- artifacts and the target --------------------------------------------------------------------------

def test_missing_or_corrupt_artifacts_say_how_to_build_them(fake_npu):
    prebuilt = fake_npu("npu2")
    build([smoke.smoke_graph()], "npu2", prebuilt)  # artifacts exist for this target, not for this model
    graphs, weights, _ = CASES["bert"]()
    with pytest.raises(ArtifactMissing, match="no npu2 artifact for this program") as e:
        Session(graphs, weights, device="npu")
    assert "aie-apps build MODEL --target npu2" in e.value.fix and e.value.exit_code == 3
    key = build(graphs, "npu2", prebuilt)
    (prebuilt / "npu2" / key / "design.elf").write_text("{}")
    with pytest.raises(ArtifactMissing, match="sha256"):
        Session(graphs, weights, device="npu")


def test_npu1_needs_an_xclbin_and_an_instruction_stream_per_dispatch(fake_npu):
    prebuilt = fake_npu("npu1")
    graphs, weights, _ = CASES["bert"]()
    key = build(graphs, "npu1", prebuilt)
    manifest = prebuilt / "manifest.json"
    doc = manifest.read_text().replace('"insts/', '"instructions/')
    manifest.write_text(doc)
    with pytest.raises(ArtifactMissing, match="insts/"):
        Session(graphs, weights, device="npu")
    assert key in doc


def test_the_target_comes_from_the_pci_id_and_unknown_ids_are_errors(fake_npu):
    fake_npu("npu1")
    assert npu.detect_target() == "npu1"
    fake_npu("npu2", device_id="0x17f0")
    assert npu.NpuBackend().target == "npu2"
    fake_npu("npu2", device_id="0x1234")
    with pytest.raises(DeviceUnavailable, match="0x1234") as e:
        npu.detect_target()
    assert "NPU_PCI_IDS" in e.value.fix
    assert "0x1234" in runtime.npu_problem()


def test_importing_the_backend_does_not_import_pyxrt():
    code = "import sys, sdk.runtime.npu, sdk.session; assert 'pyxrt' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))


# ---- the fake enforces the contract (so the tests above could fail) --------------------------------------

def test_the_host_reads_stale_data_until_a_from_device_sync(fake_npu):
    fake_npu("npu2")
    b = fake_pyxrt.bo(fake_pyxrt.device(0), 4096, fake_pyxrt.bo.host_only, 3)
    b.device[:4] = 7  # what a kernel wrote
    assert b.read(4, 0).tolist() == [0, 0, 0, 0]
    b.sync(FROM_DEVICE, 4, 0)
    assert b.read(4, 0).tolist() == [7, 7, 7, 7]


def test_a_backend_that_skips_the_output_sync_returns_stale_outputs(fake_npu, monkeypatch):
    graphs, weights, runs = _bert_on(fake_npu)
    real = npu.NpuExecutable._sync

    def no_from_device(self, arena, direction, ranges):
        if direction != FROM_DEVICE:
            real(self, arena, direction, ranges)
    with Session(graphs, weights, device="emu") as emu:
        ref = emu.run(**runs[0][1])["hidden"]
    monkeypatch.setattr(npu.NpuExecutable, "_sync", no_from_device)
    with Session(graphs, weights, device="npu") as s:
        assert not np.array_equal(s.run(**runs[0][1])["hidden"], ref)


def test_opcode_and_word_count_are_checked(fake_npu, monkeypatch):
    graphs, weights, runs = _bert_on(fake_npu, "npu1")
    with Session(graphs, weights, device="npu") as s:
        name, (bo, words) = next(iter(s._exe._insts.items()))
        s._exe._insts[name] = (bo, 4 * words)  # bytes instead of 32-bit words (mlir-aie#1609)
        with pytest.raises(ContractViolation, match="bytes"):
            s.run(**runs[0][1])
        s._exe._insts[name] = (bo, words)
        monkeypatch.setattr(npu, "OPCODE_TRANSACTION", 2)
        with pytest.raises(ContractViolation, match="opcode"):
            s.run(**runs[0][1])
        monkeypatch.setattr(npu, "OPCODE_TRANSACTION", 3)
        s.run(**runs[0][1])


def test_more_than_five_host_buffers_or_a_wrong_group_are_refused(fake_npu):
    graphs, weights, runs = _bert_on(fake_npu, "npu1")  # groups are an xclbin kernel's: an ELF kernel has none
    with Session(graphs, weights, device="npu") as s:
        exe = s._exe
        insts, words = next(iter(exe._insts.values()))
        arenas = [exe._bos["weights"], exe._no_state, exe._bos["io"], exe._bos["scratch"]]
        with pytest.raises(ContractViolation, match="6 host BOs"):
            exe.kernel(3, insts, words, *arenas, exe._bos["io"], exe._bos["io"])
        with pytest.raises(ContractViolation, match="group_id"):
            exe.kernel(3, insts, words, arenas[2], arenas[1], arenas[0], arenas[3])


def test_an_elf_kernel_is_never_asked_for_a_group(fake_npu):
    graphs, weights, runs = _bert_on(fake_npu, "npu2")
    with Session(graphs, weights, device="npu") as s:  # the fake's ELF kernel refuses group_id, as XRT would crash
        s.run(**runs[0][1])
        assert {bo.group for bo in s._exe._bos.values()} == {0}


def test_the_legacy_load_xclbin_flow_fails_like_xrt(fake_npu):
    fake_npu("npu1")
    with pytest.raises(RuntimeError, match="register_xclbin"):
        fake_pyxrt.device(0).load_xclbin("design.xclbin")


# ---- device="auto" ----------------------------------------------------------------------------------------

def _auto(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [w for w in caught if issubclass(w.category, runtime.DeviceFallbackWarning)]


def test_auto_needs_artifacts_for_this_target(fake_npu):
    fake_npu("npu2")
    choice, warned = _auto(lambda: runtime.choose_device("auto"))
    assert choice.effective == "cpu" and "aie-apps build MODEL --target npu2" in choice.reason
    assert len(warned) == 1 and "npu2" in str(warned[0].message)


def test_auto_uses_the_npu_when_device_and_artifacts_are_present(fake_npu):
    prebuilt = fake_npu("npu1")
    graphs, weights, runs = CASES["bert"]()
    build(graphs, "npu1", prebuilt)
    s, warned = _auto(lambda: Session(graphs, weights, device="auto"))
    with s:
        assert (s.device_requested, s.device_effective, warned) == ("auto", "npu", [])
        s.run(**runs[0][1])
        assert s.counters.dispatches == 1


def test_auto_falls_back_once_when_this_model_has_no_artifact(fake_npu):
    prebuilt = fake_npu("npu2")
    build([smoke.smoke_graph()], "npu2", prebuilt)  # the target has artifacts, this model has none
    graphs, weights, runs = CASES["bert"]()
    sessions, warned = _auto(lambda: [Session(graphs, weights, device="auto") for _ in range(2)])
    with Session(graphs, weights, device="cpu") as cpu:
        ref = cpu.run(**runs[0][1])["hidden"]
    for s in sessions:
        assert s.device_effective == "cpu" and "no npu2 artifact" in s.report()["fallback_reason"]
        assert np.array_equal(s.run(**runs[0][1])["hidden"], ref)
        s.close()
    assert len(warned) == 1 and fake_pyxrt.FAKE.contexts == 0


@pytest.mark.slow
def test_dictation_on_auto_falls_back_and_loses_no_audio(fake_npu):
    """The NPU looks usable (device node, pyxrt, artifacts for npu2) but Whisper has no artifact: the stream
    loads on the CPU with one warning, and every word said while it loaded is transcribed."""
    import soundfile

    from pipelines.asr import Transcriber
    from pipelines.dictation import Stream
    from .dictation_support import RATE, librivox_clips, wer

    prebuilt = fake_npu("npu2")
    build([smoke.smoke_graph()], "npu2", prebuilt)
    wav, reference = librivox_clips()[0]
    clip, _ = soundfile.read(str(wav), dtype="float32")
    made = []

    def factory():
        made.append(Transcriber("whisper-tiny.en", device="auto"))
        return made[-1]

    def talk():
        stream = Stream(factory).start()
        for i in range(0, len(clip), RATE // 10):
            stream.feed(clip[i:i + RATE // 10], RATE, block=False)
        return stream, stream.stop()
    (stream, finals), warned = _auto(talk)
    assert made[0].report()["device_effective"] == "cpu" and len(warned) == 1
    assert stream.report()["dropped_blocks"] == 0
    assert wer(reference, " ".join(f.text for f in finals)) <= 0.15, finals


# ---- aie-apps doctor's last checks ---------------------------------------------------------------------------

def test_doctor_checks_artifacts_and_runs_a_smoke_dispatch(fake_npu):
    prebuilt = fake_npu("npu1")
    found = {c.name: c for c in checks.npu_runtime_checks([], smoke.smoke_dispatch)}
    assert found["NPU artifacts"].status == "fail" and "aie-apps build" in found["NPU artifacts"].fix
    assert found["smoke dispatch"].status == "fail" and found["smoke dispatch"].fix
    build([smoke.smoke_graph()], "npu1", prebuilt)
    found = {c.name: c for c in checks.npu_runtime_checks([], smoke.smoke_dispatch)}
    assert found["NPU artifacts"].status == "ok"
    assert found["smoke dispatch"].status == "ok" and "1 dispatch on npu1" in found["smoke dispatch"].detail
    fake_pyxrt.FAKE.faults.add("timeout")
    check = {c.name: c for c in checks.npu_runtime_checks([], smoke.smoke_dispatch)}["smoke dispatch"]
    assert check.status == "fail" and "TIMEOUT" in check.detail and check.fix


# ---- the same cases on a real NPU (skipped without one) ---------------------------------------------------

@pytest.mark.npu
@pytest.mark.parametrize("name", sorted(CASES))
def test_real_npu_matches_cpu_one_dispatch_per_run(name, record_parity):
    graphs, weights, runs = CASES[name]()
    with Session(graphs, weights, device="npu") as dev, Session(graphs, weights, device="cpu") as cpu:
        uploaded = dev.counters.weight_bytes_to_device
        state_dev, state_cpu = dev.new_state(), cpu.new_state()
        for entry, inputs in runs:
            dev.counters.reset()
            ours, ref = dev.run(entry, state_dev, **inputs), cpu.run(entry, state_cpu, **inputs)
            assert dev.counters.dispatches == _dispatch_steps(dev.program, entry)
            assert dev.counters.weight_bytes_to_device == 0
            for key in ref:
                if np.asarray(ref[key]).dtype.kind == "f":
                    _, rel = record_parity(f"{name}.npu.{entry or 'forward'}.{key}", ours[key], ref[key])
                    assert rel <= TOL
        assert uploaded > 0


@pytest.mark.npu
def test_real_npu_doctor_passes_with_a_smoke_dispatch():
    found = {c.name: c for c in checks.run_checks(smoke.smoke_dispatch)}
    assert found["NPU artifacts"].status == "ok", found["NPU artifacts"]
    assert found["smoke dispatch"].status == "ok", found["smoke dispatch"]
