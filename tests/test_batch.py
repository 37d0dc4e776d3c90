"""Batch jobs on a Ray cluster (pipelines/batch.py, `--ray`): a real two-node cluster on 127.0.0.1 in a
namespace of its own (a head, and a node advertising one NPU), driven by the CLI as a user would. Outputs are
compared with the single-machine commands'; a worker is killed mid-job; a job is interrupted and resumed."""
from __future__ import annotations

import importlib.util
import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from apps.main import app
from pipelines.batch import (INSTALL, ClusterOptions, Progress, _check_reachable, job_failed, npu_resources,
                             require_ray)
from sdk.errors import ModelNotFound, SdkError, UsageError

from .conftest import FIXTURES
from .dictation_support import librivox_clips
from .ray_cluster import ROOT, LocalCluster, unusable

runner = CliRunner()
ESM = FIXTURES / "esm"
SWISSPROT = Path("/usr/share/EMBOSS/test/data/structure/swsmall.fasta")


# ---- without a cluster ----------------------------------------------------------------------------------------

def test_nothing_imports_ray_unless_a_job_runs_on_it():
    code = ("import sys, apps.main, pipelines.batch; from typer.testing import CliRunner; "
            "CliRunner().invoke(apps.main.app, ['embed-text', '--help']); assert 'ray' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_missing_cluster_extra_is_a_usage_error_with_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError, as without the extra
    with pytest.raises(UsageError) as info:
        require_ray()
    assert INSTALL in info.value.fix
    out = tmp_path / "out"
    out.mkdir()
    fasta = tmp_path / "one.fasta"
    fasta.write_text(">p1\nMKV\n")
    for args in (["embed-text", "hello", "-o", str(out / "v.npy")],
                 ["embed", str(fasta), "-o", str(out / "e.npz"), "--model", str(ESM)]):
        r = runner.invoke(app, [*args, "--ray", "auto"])
        assert r.exit_code == 2 and INSTALL in r.stderr, r.stderr
        assert not list(out.iterdir())  # nothing half-made: no parts folder a later run would trip over


def test_ray_jobs_write_files():
    fasta = Path("/usr/share/EMBOSS/test/data/globins.fasta")
    for args in (["embed-text", "hello"], ["transcribe", str(librivox_clips()[0][0])], ["embed", str(fasta)]):
        r = runner.invoke(app, [*args, "--ray", "auto"])
        assert r.exit_code == 2 and "--ray" in r.stderr and "-o" in r.stderr


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason=f"needs the cluster extra: {INSTALL}")
def test_a_wrong_model_fails_before_any_cluster_work(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as server:  # it listens, but is no cluster: the model check comes first
        r = runner.invoke(app, ["embed-text", "hello", "-o", str(tmp_path / "v.npy"), "--model", str(tmp_path / "none"),
                                "--ray", f"127.0.0.1:{server.getsockname()[1]}"])
    assert r.exit_code == 4 and "does not exist" in r.stderr and not (tmp_path / "v.npy.parts").exists()


def test_a_typed_error_raised_on_a_worker_keeps_its_type_and_fix():
    ray_error = ("The actor died because of an error raised in its creation task, ray::MapWorker(...).__init__()\n"
                 "  File \"/x/sdk/hub.py\", line 86, in resolve\n"
                 "sdk.errors.ModelNotFound: model path /m does not exist\n  fix: check the path\n")
    e = job_failed(ray_error)
    assert isinstance(e, ModelNotFound) and e.exit_code == 4
    assert e.message == "on a Ray worker: model path /m does not exist" and e.fix == "check the path"
    other = job_failed("ray.exceptions.ObjectLostError: object 123 lost\nmore")
    assert type(other) is SdkError and "ObjectLostError: object 123 lost" in other.message and "every node" in other.fix


def test_npu_resource_helper_advertises_one_per_usable_device(monkeypatch):
    from sdk.runtime import checks
    monkeypatch.setattr(checks, "run_checks", lambda smoke_dispatch: [])
    monkeypatch.setattr(checks, "find_npu_pci", lambda: [checks.NpuPci("0000:c5:00.1", 0x17F0, 0x10, "npu2")])
    monkeypatch.setattr(checks, "npu_usable", lambda found: True)
    assert npu_resources() == {"NPU": 1}
    monkeypatch.setattr(checks, "npu_usable", lambda found: False)
    assert npu_resources() == {}
    out = subprocess.run([sys.executable, "-m", "pipelines.batch"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "{}"  # this machine: no usable NPU, so no resource (`ray start --resources='{}'`)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason=f"needs the cluster extra: {INSTALL}")
def test_a_cluster_address_nothing_answers_on_is_refused_at_once(tmp_path):
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    fasta, wav = tmp_path / "one.fasta", librivox_clips()[0][0]
    fasta.write_text(">p1\nMKV\n")
    for address, says in ((closed, f"cannot reach the Ray cluster at {closed}"), ("head-without-port", "not HOST:PORT")):
        for args in (["embed-text", "hello", "-o", tmp_path / "out" / "v.npy"],
                     ["embed", fasta, "-o", tmp_path / "out" / "e.npz", "--model", ESM],
                     ["transcribe", wav, "-o", tmp_path / "out"]):
            start = time.monotonic()
            r = runner.invoke(app, [*map(str, args), "--ray", address])
            assert r.exit_code == 2 and says in r.stderr and "fix:" in r.stderr, r.stderr
            assert time.monotonic() - start < 30  # ray.init alone would retry the address for minutes
            assert not [p for p in (tmp_path / "out").rglob("*")]  # no parts or journal a later run would trip over
    with socket.create_server(("127.0.0.1", 0)) as server:  # something listens: the check lets it through
        _check_reachable(f"127.0.0.1:{server.getsockname()[1]}")


def test_options_out_of_range_are_usage_errors():
    with pytest.raises(UsageError):
        ClusterOptions(max_errors=-1)


def test_progress_line_says_done_total_rate_and_eta():
    progress = Progress(10, stream=io.StringIO())
    progress.start -= 2.0  # two seconds in
    progress.update(4)
    assert re.fullmatch(r"4/10 items, 2\.\d\d items/s, ETA 3 s", progress.line())


# ---- on a real two-node cluster ----------------------------------------------------------------------------------

needs_cluster = pytest.mark.skipif(unusable() is not None, reason=unusable() or "")


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster([{"cpus": 1}, {"cpus": 1, "resources": {"NPU": 1}}])
    try:
        yield c.start()
    finally:
        c.stop()


def _wait_for(condition, job: subprocess.Popen, timeout=900):  # a bound for a machine under heavy load
    deadline = time.monotonic() + timeout
    while not condition():
        assert job.poll() is None, job.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _single(*args) -> None:
    r = runner.invoke(app, list(map(str, args)))
    assert r.exit_code == 0, r.stderr


@needs_cluster
@pytest.mark.slow
def test_transcribe_on_the_cluster_is_interrupted_resumed_and_equals_one_machine(cluster, tmp_path):
    speech = []
    for n, sentence in enumerate(["Seven batch jobs ran on two small machines today."]):
        speech.append(tmp_path / f"flite{n}.wav")
        subprocess.run(["flite", "-voice", "slt", "-t", sentence, "-o", str(speech[-1])], check=True)
    good = [wav for wav, _ in librivox_clips()] + speech
    broken = tmp_path / "broken.wav"
    broken.write_bytes(np.random.default_rng(0).bytes(4000))  # passes the path checks, fails to decode
    one, many = tmp_path / "one", tmp_path / "many"
    one.mkdir(), many.mkdir()
    _single("transcribe", *good, "-o", one)

    job = cluster.cli_popen("transcribe", *map(str, good + [broken]), "-o", str(many), "--ray", cluster.address)
    _wait_for(lambda: any(many.glob("*.txt")), job)
    (driver,) = cluster.pids("apps.main")
    os.kill(driver, signal.SIGINT)
    _, stderr = job.communicate(timeout=900)
    assert job.returncode == 130, stderr
    done_before = len(list((many / ".aie-apps-ray").glob("shard-*.json")))  # one per transcript recorded
    assert 1 <= done_before < len(good)

    r = cluster.cli("transcribe", *map(str, good + [broken]), "-o", str(many), "--ray", cluster.address)
    # a bad file fails the job (budget 0) with its name, after every other transcript is written
    assert r.returncode == 1 and "broken.wav" in r.stderr and "1 input(s) failed" in r.stderr, r.stderr
    assert f"{len(good) + 1 - done_before} of {len(good) + 1} items ran" in r.stderr, r.stderr
    for wav in good:
        assert (many / f"{wav.stem}.txt").read_text() == (one / f"{wav.stem}.txt").read_text(), wav.name

    r = cluster.cli("transcribe", *map(str, good + [broken]), "-o", str(many), "--ray", cluster.address,
                    "--max-errors", "1")
    assert r.returncode == 0 and f"1 of {len(good) + 1} items ran" in r.stderr, r.stderr
    assert f"{len(good)} already complete, 1 failed" in r.stderr and "skipped" in r.stderr and "broken.wav" in r.stderr
    assert sorted(p.name for p in many.glob("*.txt")) == sorted(f"{w.stem}.txt" for w in good)


@needs_cluster
@pytest.mark.slow
def test_embed_text_on_the_cluster_survives_a_killed_worker_and_equals_one_machine(cluster, tmp_path, record_parity):
    words = "the a cat dog river sings under bright old quiet market train city morning light".split()
    lines = [" ".join(words[(i * k) % len(words)] for k in range(1, 4 + i % 9)) + f" {i}" for i in range(2000)]
    corpus = tmp_path / "lines.txt"
    corpus.write_text("\n".join(lines) + "\n")
    _single("embed-text", "--file", corpus, "-o", tmp_path / "one.npy")

    out = tmp_path / "many.npy"
    job = cluster.cli_popen("embed-text", "--file", str(corpus), "-o", str(out), "--ray", cluster.address)
    _wait_for(lambda: any(out.with_name("many.npy.parts").glob("part-*.npz")), job)
    workers = cluster.pids("NpuWorker")  # the actor on the second node (the one with the NPU resource)
    assert len(workers) == 1
    os.kill(workers[0], signal.SIGKILL)
    _, stderr = job.communicate(timeout=900)
    assert job.returncode == 0, stderr
    assert "2000 of 2000 items ran (1000 on cpu actors, 1000 on npu actors" in stderr, stderr  # each block once
    assert "device_effective: 2000 cpu" in stderr  # the NPU resource is a label here: no NPU, so it ran on the CPU
    many, one = np.load(out), np.load(tmp_path / "one.npy")
    assert many.shape == one.shape == (2000, 384)
    assert record_parity("MiniLM cluster vs one machine", many, one)[0] <= 1e-6
    assert not out.with_name("many.npy.parts").exists()


@needs_cluster
@pytest.mark.skipif(not SWISSPROT.exists(), reason="needs Debian emboss-test (swsmall.fasta)")
def test_embed_fasta_on_the_cluster_equals_one_machine(cluster, tmp_path, record_parity):
    rng = np.random.default_rng(1)
    alphabet = np.array(list("ACDEFGHIKLMNPQRSTVWY"))
    generated = "".join(f">gen{i}\n{''.join(rng.choice(alphabet, rng.integers(20, 200)))}\n" for i in range(157))
    fasta = tmp_path / "proteins.fasta"
    fasta.write_text(SWISSPROT.read_text() + generated)
    _single("embed", fasta, "-o", tmp_path / "one.npz", "--model", ESM, "--device", "cpu")

    r = cluster.cli("embed", str(fasta), "-o", str(tmp_path / "many.npz"), "--model", str(ESM), "--device", "cpu",
                    "--ray", cluster.address)
    assert r.returncode == 0 and "300 of 300 items ran (300 on cpu actors" in r.stderr, r.stderr
    with np.load(tmp_path / "one.npz") as one, np.load(tmp_path / "many.npz") as many:
        assert sorted(one.files) == sorted(many.files)
        for key in one.files:
            if key == "embeddings":
                assert record_parity("ESM-2 tiny cluster vs one machine", many[key], one[key])[0] <= 1e-6
            else:
                assert many[key].tolist() == one[key].tolist(), key
