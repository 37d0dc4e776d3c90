"""Side-by-side timing for bench/ scripts: every contender runs in interleaved ~1 s blocks inside one
process, so machine noise (shared vCPUs) hits all of them alike; ratios are what we report.

    from harness import threads, compare, onnx_session
    threads(2)                       # before the heavy imports
    stats = compare({"ours": f, "torch": g, "onnxruntime": h})
    print_table("MiniLM-L6 seq 128", stats)
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
THREADS = 2
SCRATCH = tempfile.TemporaryDirectory(prefix="aie-bench-")  # this run's exports (0.1-1 GB each); removed at exit


def threads(n: int = 2) -> None:
    """Pin every runtime to n threads. Call before importing numpy/torch (OpenBLAS reads env at load)."""
    global THREADS
    THREADS = n
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "AIE_APPS_THREADS"):
        os.environ[var] = str(n)


def torch_threads():
    import torch
    torch.set_num_threads(THREADS)
    return torch


def scratch(suffix: str = "") -> str:
    """A fresh file path in SCRATCH, for an export or a recording this run makes and reads back."""
    fd, path = tempfile.mkstemp(suffix=suffix, dir=SCRATCH.name)
    os.close(fd)
    return path


def onnx_session(path: str):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = THREADS, 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def export_encoder(torch, hf_model, ids, mask) -> str:
    """torch's ONNX export of a Hugging Face encoder, as a plain ORT user makes it: inputs "ids" and "mask" (int64;
    the mask too, as ours takes one: the same work), output "hidden" (last_hidden_state). Returns its path."""
    class LastHidden(torch.nn.Module):  # the exporter wants positional tensors in, tensors out
        def __init__(self):
            super().__init__()
            self.model = hf_model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    path = scratch(".onnx")
    with torch.no_grad():
        args = tuple(torch.tensor(a, dtype=torch.long) for a in (ids, mask))
        torch.onnx.export(LastHidden().eval(), args, path, input_names=["ids", "mask"], output_names=["hidden"],
                          dynamo=False, opset_version=17)
    return path


def compare(cases: dict[str, Callable[[], object]], *, warmup: int = 2, block_s: float = 1.0,
            min_blocks: int = 5, max_s: float = 90.0) -> dict[str, list[float]]:
    """Interleaved blocks until each case has >= min_blocks blocks (or max_s passes). Returns seconds per call."""
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    samples = {name: [] for name in cases}
    start, blocks = time.perf_counter(), 0
    while blocks < min_blocks or (time.perf_counter() - start < 10 and blocks < 2 * min_blocks):
        for name, fn in cases.items():
            t_block, ran = time.perf_counter(), False
            while not ran or time.perf_counter() - t_block < block_s:  # at least one call per block
                t = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t)
                ran = True
            time.sleep(0.2)  # let the other runtime's spinning threads go idle
        blocks += 1
        if time.perf_counter() - start > max_s:
            break
    return samples


def print_table(title: str, samples: dict[str, list[float]], *, ours: str = "ours", unit: float = 1e3,
                unit_name: str = "ms") -> dict[str, float]:
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"\n{title}  ({THREADS} threads; median of interleaved samples)")
    for name, m in med.items():
        p10 = sorted(samples[name])[len(samples[name]) // 10]
        print(f"  {name:<20} {m * unit:9.2f} {unit_name}   (p10 {p10 * unit:.2f}, n={len(samples[name])})")
    for name, m in med.items():
        if name != ours:
            print(f"  ratio {ours}/{name}: {med[ours] / m:.2f}")
    return med
