"""The batch commands on a Ray cluster: transcribe an archive, embed a proteome or a corpus across machines.

Needs the optional `cluster` extra (Ray Data); nothing else in the SDK imports ray. The inputs become a Ray
dataset of items (an id, a digest of the input and settings it is made from, the payload: a file path, a
sequence, a line); `map_batches` runs them through an actor pool, one pipeline object per actor (weights load
once per actor). A node that advertises the `NPU` custom resource (see `npu_resources`) gets one NPU actor per
device; the other CPUs get CPU actors of `cpus_per_actor` cores each. The driver writes each finished block
as one shard, atomically, in the single-machine command's format; what a shard holds is known by id and
digest, so rerunning the same command skips it (resume), and a block Ray retries after a worker died is
written once. A bad input is reported and skipped, up to `max_errors`; more fail the job with the list, after
everything else is saved. (Ray Data's CheckpointConfig is not used: it tracks rows written by a Ray Datasink in
a store of its own, a second record of what is done beside outputs that already say it.)

    from pipelines.batch import ClusterOptions, embed_texts
    report = embed_texts(lines, Path("vectors.npy"), model="all-MiniLM-L6-v2", device="auto",
                         cluster=ClusterOptions(address="auto"))
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from sdk import errors, hub, settings
from sdk.errors import InputError, SdkError, UsageError

INSTALL = "pip install 'aie-apps[cluster]'"
NPU_RESOURCE = "NPU"
CONNECT_TIMEOUT_S = 5.0  # for a cluster's HOST:PORT to accept a connection


@dataclass(frozen=True)
class ClusterOptions:
    address: str = "auto"         # "auto": the Ray running on this machine, else a new local one; or "HOST:PORT"
    batch_size: int | None = None  # items per actor call and per shard written; None: the task's own
    max_errors: int = 0           # bad inputs skipped (and listed) before the job fails
    cpus_per_actor: int = 1       # cores each CPU actor's pipeline uses (its cpu backend's threads)
    npu_weight: float = 1.0       # items an NPU actor gets for each item a CPU actor gets (the split is made up front)

    def __post_init__(self):
        if (self.batch_size or 1) < 1 or self.max_errors < 0 or self.cpus_per_actor < 1 or self.npu_weight <= 0:
            raise UsageError(f"cluster options out of range: {self}",
                             fix="batch_size >= 1, max_errors >= 0, cpus_per_actor >= 1, npu_weight > 0")


@dataclass(frozen=True)
class Item:
    id: str        # names the output: a file path, a FASTA id, a line number
    digest: str    # the input and settings the output is made from: equal digests mean an equal output
    payload: str   # what the pipeline takes: a file path, a sequence, a text


@dataclass
class BatchReport:
    total: int
    skipped: int = 0                                       # complete from an earlier run
    ran: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)  # (id, why)
    by_kind: Counter = field(default_factory=Counter)      # items per actor kind: "npu" / "cpu"
    by_device: Counter = field(default_factory=Counter)    # items per device_effective
    actors: dict = field(default_factory=dict)              # actor kind -> count
    elapsed: float = 0.0

    def summary(self) -> str:
        kinds = ", ".join(f"{n} on {k} actors" for k, n in sorted(self.by_kind.items())) or "none run"
        devices = ", ".join(f"{n} {d}" for d, n in sorted(self.by_device.items()))
        rate = self.ran / self.elapsed if self.elapsed > 0 else 0.0
        return (f"{self.ran} of {self.total} items ran ({kinds}; device_effective: {devices or '-'}), "
                f"{self.skipped} already complete, {len(self.failed)} failed; "
                f"{self.elapsed:.1f} s, {rate:.2f} items/s")


def require_ray(address: str = "auto"):
    """The ray module, or the typed error that says how to install it; a cluster's HOST:PORT must accept a
    connection (checked here, before anything is written: ray.init would retry it for minutes)."""
    try:
        import ray
        import ray.data  # noqa: F401  (the data library is a separate part of the ray package)
    except ImportError:
        raise UsageError("--ray needs Ray Data, which is not installed", fix=f"install it: {INSTALL}") from None
    if address != "auto":
        _check_reachable(address)
    return ray


def npu_resources() -> dict[str, int]:
    """The custom resources a node should advertise when it joins: `{"NPU": devices}` when doctor's checks say
    the NPU is usable, else none. `aie-apps` nodes join with
    `ray start --address=HEAD:6379 --resources="$(python -m pipelines.batch)"`."""
    from sdk.runtime.checks import find_npu_pci, npu_usable, run_checks
    from sdk.smoke import smoke_dispatch

    return {NPU_RESOURCE: len(find_npu_pci())} if npu_usable(run_checks(smoke_dispatch)) else {}


# ---- what one actor runs ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TranscribeTask:
    model: str
    options: object  # pipelines.asr.TranscribeOptions
    batch_size = 1   # a file is seconds of work: one per shard keeps resume and retries fine-grained

    def open(self, device):
        from pipelines.asr import Transcriber
        return Transcriber(self.model, device=device, options=self.options)

    def run(self, pipeline, payloads: list[str]) -> list:
        return [pipeline.transcribe(Path(p)) for p in payloads]


@dataclass(frozen=True)
class ProteinTask:
    model: str
    options: object  # pipelines.protein.ProteinOptions
    batch_size = 32  # the embedder packs these into its own token-budget batches

    def open(self, device):
        from pipelines.protein import ProteinEmbedder
        return ProteinEmbedder(self.model, device=device, options=self.options)

    def run(self, pipeline, payloads: list[str]) -> list:
        return list(pipeline.embed(list(payloads)))


@dataclass(frozen=True)
class TextTask:
    model: str
    options: object  # pipelines.text.TextOptions
    batch_size = 64

    def open(self, device):
        from pipelines.text import TextEmbedder
        return TextEmbedder(self.model, device=device, options=self.options)

    def run(self, pipeline, payloads: list[str]) -> list:
        return list(pipeline.embed(list(payloads)))


class _Worker:
    """One actor: one pipeline, built once; each call runs one batch of items. A bad item is returned with
    its error (the batch is rerun item by item to find it), never raised: Ray would retry it forever."""
    task, device, kind = None, None, ""  # set by `_worker_class`

    def __init__(self):
        self.pipeline = self.task.open(self.device)

    def __call__(self, batch: dict) -> dict:
        payloads = [str(p) for p in batch["payload"]]
        results, errors = [None] * len(payloads), [""] * len(payloads)
        try:
            results = self.task.run(self.pipeline, payloads)
        except SdkError:
            for i, p in enumerate(payloads):
                try:
                    results[i] = self.task.run(self.pipeline, [p])[0]
                except SdkError as e:
                    errors[i] = e.message + (f" (fix: {e.fix})" if e.fix else "")
        column = np.empty(len(payloads), dtype=object)  # one object per item: a Transcript, a vector, rows
        for i, r in enumerate(results):
            column[i] = r
        device = self.pipeline.report()["device_effective"]
        return {"id": batch["id"], "digest": batch["digest"], "result": column, "error": np.array(errors),
                "kind": np.full(len(payloads), self.kind), "device": np.full(len(payloads), device)}


# ---- the driver ---------------------------------------------------------------------------------------------

def run(task, items: Sequence[Item], save: Callable[[list[Item], list], None], *, done: dict[str, str],
        device: str | None, cluster: ClusterOptions) -> BatchReport:
    """Run `items` not already in `done` (id -> digest) on the cluster; `save(items, results)` writes one
    shard atomically. Raises InputError listing the bad inputs when there are more than `max_errors`."""
    ray = require_ray(cluster.address)
    device = device or settings.load().device  # placement depends on it: read here, not in each actor
    if device not in settings.DEVICES:
        raise UsageError(f"unknown device {device!r}", fix=f"use one of {', '.join(settings.DEVICES)}")
    todo = [it for it in items if done.get(it.id) != it.digest]
    report = BatchReport(total=len(items), skipped=len(items) - len(todo))
    by_id = {it.id: it for it in todo}
    start = time.perf_counter()
    if todo:
        _connect(ray, cluster.address)
        try:
            dataset, report.actors = _dataset(ray, task, todo, device, cluster)
            progress = Progress(len(todo))
            for block in dataset.iter_batches(batch_size=None, batch_format="numpy"):
                ok = [i for i, e in enumerate(block["error"]) if not e]
                for i, e in enumerate(block["error"]):
                    if e:
                        report.failed.append((str(block["id"][i]), str(e)))
                if ok:
                    save([by_id[str(block["id"][i])] for i in ok], [block["result"][i] for i in ok])
                report.ran += len(block["id"])
                report.by_kind.update(str(k) for k in block["kind"])
                report.by_device.update(str(d) for d in block["device"])
                progress.update(len(block["id"]))
            progress.close()
        except ray.exceptions.RayError as e:  # the job stopped: an actor could not start, or Ray itself failed
            raise job_failed(str(e)) from None
        finally:
            ray.shutdown()
    report.elapsed = time.perf_counter() - start
    if len(report.failed) > cluster.max_errors:
        shown = "\n".join(f"  {i}: {why}" for i, why in report.failed[:20])
        more = f"\n  ... ({len(report.failed)} in all)" if len(report.failed) > 20 else ""
        raise InputError(f"{len(report.failed)} input(s) failed (budget {cluster.max_errors}); everything else "
                         f"is saved ({report.summary()}):\n{shown}{more}",
                         fix="fix or remove them and rerun the same command (only they run), or raise --max-errors")
    for i, why in report.failed:
        print(f"warning: skipped {i}: {why}", file=sys.stderr)
    return report


def job_failed(ray_error: str) -> SdkError:
    """Ray's error as ours: a typed error a worker raised (a model missing on that node) keeps its type, message
    and fix; anything else names Ray's first line."""
    typed = re.search(r"^sdk\.errors\.(\w+): (.*)$(?:\n  fix: (.*)$)?", ray_error, re.MULTILINE)
    if typed and isinstance(getattr(errors, typed[1], None), type):
        return getattr(errors, typed[1])(f"on a Ray worker: {typed[2]}", fix=typed[3] or "")
    return SdkError(f"the Ray job failed: {ray_error.strip().splitlines()[0]}",
                    fix="check that aie-apps and its models are installed on every node; Ray's logs are under "
                        "/tmp/ray/session_latest/logs on each node")


def _check_reachable(address: str):
    """A HOST:PORT nothing listens on is refused within CONNECT_TIMEOUT_S."""
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not host or not port.isdigit():
        raise UsageError(f"--ray {address!r} is not HOST:PORT",
                         fix="pass the head's address as `ray start --head` printed it (e.g. 10.0.0.5:6379), or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise UsageError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}",
                         fix="start it with `ray start --head` (see README, cluster), or pass its HOST:PORT") from None


def _connect(ray, address: str | None):
    # worker output stays on the workers: stdout carries results only, and errors come back as data
    common = dict(log_to_driver=False, logging_level="warning", configure_logging=True)
    try:
        ray.init(address=None if address == "auto" else address, **common)
    except ConnectionError as e:
        raise UsageError(f"cannot reach the Ray cluster at {address}: {e}",
                         fix="start it with `ray start --head` (see README, cluster), or pass its HOST:PORT") from None
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # its plan, timing and progress-bar notes: not ours to show
    from ray.data import DataContext
    context = DataContext.get_current()
    context.enable_progress_bars = False  # one line of our own instead (Progress)
    context.max_errored_blocks = 0        # bad items come back as data; a block that raises is a bug: stop


def _dataset(ray, task, todo: list[Item], device: str | None, cluster: ClusterOptions):
    """The items split between an NPU actor pool (one actor per `NPU` resource) and a CPU actor pool (the
    remaining CPUs), unioned. Returns the dataset and the actor counts."""
    resources = ray.cluster_resources()
    npus = int(resources.get(NPU_RESOURCE, 0)) if device in ("auto", "npu") else 0
    if device == "npu" and not npus:
        raise UsageError(f"--device npu, but no node of the cluster advertises the {NPU_RESOURCE} resource",
                         fix="start NPU nodes with `ray start ... --resources=\"$(python -m pipelines.batch)\"`, "
                             "or use --device auto")
    spare = int(resources.get("CPU", 0)) - npus  # an NPU actor holds one core for its host work
    if not npus and spare < cluster.cpus_per_actor:
        raise UsageError(f"the Ray cluster has {spare} CPUs, fewer than one actor's {cluster.cpus_per_actor}",
                         fix="join nodes with CPUs (`ray start --num-cpus N`), or lower cpus_per_actor")
    cpu_actors = 0 if device == "npu" else max(1 if not npus else 0, spare // cluster.cpus_per_actor)
    npu_share = npus * cluster.npu_weight / (npus * cluster.npu_weight + cpu_actors)
    groups: dict[str, list[Item]] = {"npu": [], "cpu": []}
    for i, item in enumerate(todo):  # interleaved, so both pools see long and short inputs alike
        groups["npu" if math.floor((i + 1) * npu_share) > math.floor(i * npu_share) else "cpu"].append(item)
    threads = {"env_vars": {"AIE_APPS_THREADS": str(cluster.cpus_per_actor)}}
    pools = []
    actor_pool = ray.data.ActorPoolStrategy
    for kind, actors, remote in (("npu", npus, dict(num_cpus=1, resources={NPU_RESOURCE: 1})),
                                 ("cpu", cpu_actors, dict(num_cpus=cluster.cpus_per_actor, runtime_env=threads))):
        items = groups[kind]
        if not items or not actors:
            continue
        rows = [{"id": it.id, "digest": it.digest, "payload": it.payload} for it in items]
        batch_size = cluster.batch_size or task.batch_size
        blocks = math.ceil(len(rows) / batch_size)
        pools.append(ray.data.from_items(rows, override_num_blocks=blocks).map_batches(
            _worker_class(task, device if kind == "npu" else _cpu_device(device), kind),
            batch_size=batch_size, compute=actor_pool(size=min(actors, blocks)), batch_format="numpy",
            **remote))
    dataset = pools[0] if len(pools) == 1 else pools[0].union(*pools[1:])
    return dataset, {"npu": npus if groups["npu"] else 0, "cpu": cpu_actors if groups["cpu"] else 0}


def _worker_class(task, device: str | None, kind: str) -> type:
    """_Worker bound to its job. The class travels by value, so a restarted actor needs no constructor
    arguments kept in the object store (they could be gone after a node died)."""
    return type(f"{kind.capitalize()}Worker", (_Worker,), {"task": task, "device": device, "kind": kind})


def _cpu_device(device: str) -> str:
    """CPU actors run where no NPU was given to them: `auto` would grab a local NPU the NPU actor owns."""
    return "cpu" if device == "auto" else device


class Progress:
    """Items done / total, rate and ETA as one line on stderr, redrawn in place on a terminal."""

    def __init__(self, total: int, stream=None):
        self.total, self.done = total, 0
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self.live = self.stream.isatty()

    def line(self) -> str:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_text = f"{eta:.0f} s" if math.isfinite(eta) else "?"
        return f"{self.done}/{self.total} items, {rate:.2f} items/s, ETA {eta_text}"

    def update(self, n: int):
        self.done += n
        if self.live:
            self.stream.write("\r" + self.line())
            self.stream.flush()

    def close(self):
        if self.live:
            self.stream.write("\n")
            self.stream.flush()


# ---- the three commands' jobs -------------------------------------------------------------------------------

def digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _write_atomic(path: Path, write: Callable):
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        write(f)
    os.replace(tmp, path)


def transcribe(files: Sequence[Path], output_dir: Path, target: Callable[[Path], Path],
               render: Callable[[object], str], *, model: str, options, device: str | None,
               cluster: ClusterOptions) -> BatchReport:
    """Each file's transcript to `target(file)` (what the single-machine command writes). What was made from
    what is kept in OUTPUT_DIR/.aie-apps-ray/ (shard files of id -> digest) for resume; an input's digest is its
    path, size and modification time with the settings."""
    require_ray(cluster.address)  # before anything is written
    hub.resolve(model)  # a wrong model name fails here, not in every actor
    journal = output_dir / ".aie-apps-ray"
    journal.mkdir(exist_ok=True)
    done = {}
    for shard in journal.glob("shard-*.json"):
        done.update(json.loads(shard.read_text()))
    settings = (model, repr(options), target(Path("x")).suffix)
    items = []
    for path in files:
        stat = path.stat()
        item = Item(str(path.resolve()), digest(settings, str(path.resolve()), stat.st_size, stat.st_mtime_ns),
                    str(path.resolve()))
        if done.get(item.id) == item.digest and not target(path).exists():
            done.pop(item.id)  # the transcript was deleted since: make it again
        items.append(item)

    def save(batch: list[Item], results: list):
        for item, transcript in zip(batch, results):
            out = target(Path(item.id))
            _write_atomic(out, lambda f: f.write(render(transcript).encode("utf-8")))
        record = {it.id: it.digest for it in batch}
        _write_atomic(journal / f"shard-{digest(sorted(record.items()))[:16]}.json",
                      lambda f: f.write(json.dumps(record).encode()))

    return run(TranscribeTask(model, options), items, save, done=done, device=device, cluster=cluster)


def embed_fasta(records: Sequence, save: Callable[[list, list], None], *, model: str, options,
                device: str | None, cluster: ClusterOptions) -> BatchReport:
    """ESM-2 embeddings of `records` (the ones still to do: `aie-apps embed` keeps its own parts and resume);
    `save(records, vectors)` writes one part."""
    by_id = {r.id: r for r in records}
    items = [Item(r.id, "", r.sequence) for r in records]
    return run(ProteinTask(model, options), items, lambda batch, vectors: save([by_id[it.id] for it in batch], vectors),
               done={}, device=device, cluster=cluster)


def embed_texts(texts: Sequence[str], output: Path, *, model: str, options=None, device: str | None,
                cluster: ClusterOptions) -> BatchReport:
    """Sentence embeddings of `texts`, in order, to the .npy `output`. Shards go to OUTPUT.parts/ (npz:
    line numbers, digests, vectors); a rerun keeps those whose digest matches; the folder goes once `output`
    is whole."""
    from pipelines.text import TextOptions
    require_ray(cluster.address)  # before anything is written
    hub.resolve(model)
    options = options or TextOptions()
    parts = output.with_name(output.name + ".parts")
    parts.mkdir(exist_ok=True)
    items = [Item(str(n), digest(model, repr(options), text), text) for n, text in enumerate(texts)]
    wanted = {it.id: it.digest for it in items}
    done, vectors = {}, {}
    for part in sorted(parts.glob("part-*.npz")):
        with np.load(part) as p:
            for i, d, v in zip(p["ids"].tolist(), p["digests"].tolist(), p["data"]):
                if wanted.get(i) == d:  # a line edited since, or another input's part, is embedded again
                    done[i], vectors[i] = d, v

    def save(batch: list[Item], results: list):
        data = np.stack(results).astype(np.float32)
        ids = [it.id for it in batch]
        name = f"part-{digest(ids)[:16]}.npz"
        _write_atomic(parts / name, lambda f: np.savez(f, ids=np.array(ids), digests=np.array([it.digest for it in batch]),
                                                      data=data))
        vectors.update(zip(ids, data))

    report = run(TextTask(model, options), items, save, done=done, device=device, cluster=cluster)
    missing = [it.id for it in items if it.id not in vectors]
    if missing:  # only when failures were within the budget: no matrix can be written without their rows
        raise InputError(f"{len(missing)} line(s) have no embedding (first: line {int(missing[0]) + 1}); the others "
                         f"are saved in {parts}", fix="fix those lines and rerun the same command")
    matrix = np.stack([vectors[it.id] for it in items])
    _write_atomic(output, lambda f: np.save(f, matrix))
    shutil.rmtree(parts, ignore_errors=True)
    return report


if __name__ == "__main__":  # `ray start ... --resources="$(python -m pipelines.batch)"`
    print(json.dumps(npu_resources()))
