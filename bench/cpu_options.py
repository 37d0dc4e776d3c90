"""What each of the cpu backend's ONNX Runtime session choices costs: ours as shipped vs ours with one choice
changed vs ONNX Runtime on torch's export, interleaved in one process, BERT-base shape, batch 1, seq 128, 2 threads.

    python bench/cpu_options.py              # on the machine as it is (say its load)
    python bench/cpu_options.py --busy 2     # with 2 busy-loop processes beside it: the loaded-machine case
The choices (sdk/runtime/cpu.py `CpuExecutable._options`, `PACK_ROWS`): intra-op spinning off (on: ORT's
default; or on for a bounded time, `session.intra_op.spin_duration_us`), the memory pattern off, and the linears'
weights given to the entry's session as constants that ORT packs once ("unpacked": bound in place as graph
inputs, which ORT packs again on every run). ORT's profiler (`--profile`) prints each one's summed kernel time
per op type, to tell time in kernels from time between them.
Needs the `reference` extra (torch, transformers, onnxruntime, onnx).
"""
from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
from dataclasses import asdict

from harness import compare, export_encoder, onnx_session, print_table, threads, torch_threads

parser = argparse.ArgumentParser()
parser.add_argument("--busy", type=int, default=0, help="busy-loop processes to run beside the measurement")
parser.add_argument("--profile", action="store_true", help="ORT's per-op kernel time, ours vs the export")
args = parser.parse_args()
threads(2)

import numpy as np  # noqa: E402

from sdk import compiler  # noqa: E402
from sdk.models import bert  # noqa: E402
from sdk.runtime import cpu  # noqa: E402

SEQ = 128
VARIANTS = {  # label -> session config entries and option attributes set over ours
    "ours": {},
    "spin": {"session.intra_op.allow_spinning": "1"},
    "spin <= 50 us": {"session.intra_op.allow_spinning": "1", "session.intra_op.spin_duration_us": "50"},
    "mem pattern": {"enable_mem_pattern": True},
    "unpacked": {"unpacked": True},
}


def variant(config: dict, profile: bool):
    class Variant(cpu.CpuExecutable):
        def __init__(self, *a):
            saved = cpu.PACK_ROWS  # read while the entries' graphs are written
            cpu.PACK_ROWS = 1 << 62 if config.get("unpacked") else saved
            try:
                super().__init__(*a)
            finally:
                cpu.PACK_ROWS = saved

        def _options(self, pack):
            options = super()._options(pack)
            for key, value in config.items():
                if "." in key:
                    options.add_session_config_entry(key, value)
                elif key != "unpacked":
                    setattr(options, key, value)
            options.enable_profiling = profile
            return options
    return Variant


def kernel_ms(profile_path: str, runs: int) -> dict[str, float]:
    total = collections.Counter()
    for event in json.load(open(profile_path)):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            total[event["args"]["op_name"]] += event["dur"]
    return {op: round(us / runs / 1e3, 2) for op, us in total.most_common(8)}


def main():
    torch = torch_threads()
    import transformers
    cfg = bert.Config()  # bert-base shape, random weights
    hf = transformers.BertModel(transformers.BertConfig(**asdict(cfg)), add_pooling_layer=False).eval()
    weights = {k: v.detach().numpy() for k, v in hf.state_dict().items() if k in bert.param_shapes(cfg)}
    program = compiler.compile([bert.graph(cfg, 1, SEQ)])
    ids = np.random.default_rng(0).integers(1000, 2000, size=(1, SEQ)).astype(np.int32)
    inputs = {"ids": ids, "token_types": np.zeros_like(ids), "mask": np.ones(ids.shape, np.float32)}
    feed = {"ids": ids.astype(np.int64), "mask": inputs["mask"].astype(np.int64)}
    path = export_encoder(torch, hf, ids, inputs["mask"])
    peer = onnx_session(path)
    exes = {label: variant(config, False)(program, weights, 2) for label, config in VARIANTS.items()}
    cases = {label: (lambda exe=exe: exe.run(None, inputs)["hidden"]) for label, exe in exes.items()}
    cases["onnxruntime"] = lambda: peer.run(None, feed)[0]
    ref = cases["onnxruntime"]()
    print("  (check: max-abs vs onnxruntime: " + ", ".join(
        f"{label} {np.abs(cases[label]() - ref).max():.1e}" for label in exes) + ")")
    busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.busy)]
    try:
        print(f"  load before: {open('/proc/loadavg').read().split()[:3]}, busy loops beside: {args.busy}")
        print_table(f"BERT-base shape, batch 1, seq {SEQ}, one session choice changed at a time", compare(cases))
        print(f"  load after: {open('/proc/loadavg').read().split()[:3]}")
    finally:
        for p in busy:
            p.kill()
    if args.profile:
        runs = 20
        ours = variant({}, True)(program, weights, 2)
        options = peer.get_session_options()
        options.enable_profiling = True
        export = type(peer)(path, options, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            ours.run(None, inputs)
            export.run(None, feed)
        (session,) = ours.sessions.values()
        print(f"  kernel ms per run, ours:   {kernel_ms(session.end_profiling(), runs)}")
        print(f"  kernel ms per run, export: {kernel_ms(export.end_profiling(), runs)}")


if __name__ == "__main__":
    main()
