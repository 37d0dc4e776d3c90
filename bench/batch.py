"""Batch jobs on Ray vs one process: items/s of `aie-apps embed-text` and `aie-apps transcribe` with 1 and 2
Ray worker processes, and the per-item overhead of going through Ray.

    PYTHONPATH=. python bench/batch.py [--lines 2000] [--copies 2] [--rounds 3]

Contenders: one process with one thread (AIE_APPS_THREADS and BLAS's threads 1: a Ray worker with one CPU gets
OMP_NUM_THREADS=1 from Ray) and with the default threads, then `--ray` on a 1-node and on a 2-node cluster of 1-CPU nodes (one CPU actor per node), each cluster
on 127.0.0.1 in a namespace of its own (tests/ray_cluster.py; needs root). Each is the CLI a user runs, as a
new process, timed wall to wall (start-up and model loading included), on the whole input and on one item:
the one-item time is the fixed start-up, (whole - one) / (items - 1) the time per item once running, and its
excess over one process with one thread the per-item overhead of going through Ray. The
contenders run interleaved, round after round; medians are reported. The machine has 2 cores shared with other
work: the load average is printed before and after. Not a test: nothing is asserted.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.dictation_support import librivox_clips  # noqa: E402
from tests.ray_cluster import LocalCluster, unusable  # noqa: E402


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def corpus(folder: Path, lines: int, copies: int) -> tuple[dict[int, Path], list[Path]]:
    words = "the a cat dog river sings under bright old quiet market train city morning light".split()
    body = ["".join(" ".join(words[(i * k) % len(words)] for k in range(1, 4 + i % 9)) + f" {i}\n")
            for i in range(lines)]
    text = {}
    for n in (1, lines):  # the whole corpus, and its first line for the start-up cost
        text[n] = folder / f"lines-{n}.txt"
        text[n].write_text("".join(body[:n]))
    audio = []
    for n in range(copies):  # the 5 LibriVox clips, `copies` times under other names
        for wav, _ in librivox_clips():
            audio.append(folder / f"{wav.stem}-{n}.wav")
            shutil.copy(wav, audio[-1])
    return text, audio


def timed(command: list[str], env: dict) -> float:
    start = time.perf_counter()
    r = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{r.stderr}")
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=2000, help="embed-text: lines")
    parser.add_argument("--copies", type=int, default=2, help="transcribe: copies of the 5 LibriVox clips")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", default="embed-text,transcribe", help="which of embed-text,transcribe to time")
    args = parser.parse_args()
    if unusable():
        raise SystemExit(f"cannot start a cluster here: {unusable()}")

    work = Path(tempfile.mkdtemp(prefix="aie-bench-batch-"))
    text, audio = corpus(work, args.lines, args.copies)
    base = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    print(f"load average before: {load()}  (2 cores)")
    clusters = {1: LocalCluster([{"cpus": 1}]), 2: LocalCluster([{"cpus": 1}, {"cpus": 1}])}
    try:
        for c in clusters.values():
            c.start()
        jobs = {"embed-text": (args.lines, lambda out, n: ["embed-text", "--file", str(text[n]), "-o", str(out / "v.npy")]),
                "transcribe": (len(audio), lambda out, n: ["transcribe", *map(str, audio[:n]), "-o", str(out)])}
        for job, (items, argv) in jobs.items():
            if job not in args.jobs.split(","):
                continue
            def single(threads):
                pinned = {var: str(threads) for var in ("AIE_APPS_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
                env = {**base, **(pinned if threads else {})}
                return lambda out, n: timed([sys.executable, "-m", "apps.main", *argv(out, n), "--device", "cpu"], env)

            def on_ray(c):
                return lambda out, n: timed(c.command([sys.executable, "-m", "apps.main", *argv(out, n), "--device",
                                                       "cpu", "--ray", c.address]), c.env)

            contenders = {"1 process, 1 thread": single(1), "1 process, 2 threads": single(None),
                          **{f"ray, {n} worker{'s' if n > 1 else ''}": on_ray(c) for n, c in clusters.items()}}
            seconds = {(name, n): [] for name in contenders for n in (1, items)}
            for _ in range(args.rounds):
                for (name, n), samples in seconds.items():
                    out = Path(tempfile.mkdtemp(dir=work))  # a fresh output: nothing to resume
                    samples.append(contenders[name](out, n))
                    shutil.rmtree(out)
            med = {key: statistics.median(s) for key, s in seconds.items()}

            def marginal(name):  # seconds per item once started: the fixed start-up (1 item) taken out
                return (med[name, items] - med[name, 1]) / (items - 1)

            print(f"\n{job}: {items} items, medians of {args.rounds} interleaved runs, wall clock per command")
            print(f"{'':22} {'seconds':>8} {'items/s':>8} {'start-up (1 item) s':>20} {'ms/item after':>14} "
                  f"{'overhead ms/item':>17}")
            for name in contenders:
                print(f"{name:22} {med[name, items]:8.1f} {items / med[name, items]:8.2f} {med[name, 1]:20.1f} "
                      f"{1000 * marginal(name):14.1f} {1000 * (marginal(name) - marginal('1 process, 1 thread')):+17.1f}")
    finally:
        for c in clusters.values():
            c.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nload average after: {load()}")


if __name__ == "__main__":
    main()
