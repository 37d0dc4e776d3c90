"""`aie-apps bench MODEL`: what one run of each entry of a model costs on the NPU.

Different things, labelled as such:
- the cost model's ESTIMATE of the latency on --target (npu1 | npu2), from the compiled program;
- counters MEASURED on the backend (--device emu: dispatches, host<->device syncs and bytes, weight bytes per
  run), and the backend's host wall time (on emu that is numpy emulating the NPU, not NPU time);
- with --energy, the package energy counter (sdk.powercap) around the same runs on the CPU and on the NPU side
  by side, and around an idle interval as long as the longest of them.

MODEL is a model name or folder (real weights: all-MiniLM-L6-v2, whisper-tiny.en, ...) or one of the shape
presets below (random weights; for estimates at real sizes: whisper-small, minilm, vit-b16, esm2-35m).
"""
from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from sdk.errors import DeviceUnavailable, EnergyCounterUnavailable, UsageError, WeightError

from .cli import JsonOpt, app, command, err, out_json

TargetOpt = Annotated[str, typer.Option("--target", help="npu1 | npu2: the device the estimate is for")]


def _presets():
    from sdk.models import bert, esm, vit, whisper
    return {
        "whisper-small": ("whisper", whisper.Config(d_model=768, encoder_layers=12, encoder_attention_heads=12,
                                                    encoder_ffn_dim=3072, decoder_layers=12, decoder_attention_heads=12,
                                                    decoder_ffn_dim=3072)),
        "minilm": ("bert", bert.Config(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                       intermediate_size=1536)),
        "vit-b16": ("vit", vit.Config()),
        "esm2-35m": ("esm", esm.PRESETS["esm2_t12_35M_UR50D"]),
    }


def _graphs(family: str, cfg, length: int, folder: Path | None):
    """The graphs of the program the pipeline serving this model loads (pipelines/*.py program_graphs, so that
    `--device npu` finds what `aie-apps build` built), and the entries a benchmark runs, in order (one shared state):
    batch 1 at the smallest bucket that holds `length`. Shape presets have no folder: one graph at `length`."""
    from pipelines import asr, conformer_asr, protein, text, vision
    from sdk.models import bert, conformer, esm, vit, whisper
    if family == "whisper":
        return (asr.program_graphs(folder) if folder else whisper.graphs(cfg)), ["encode", "decode_step"]
    if family == "bert":
        o = text.TextOptions()
        buckets = bert.length_buckets(cfg, o.max_length, o.buckets)
        if length > buckets[-1]:
            raise UsageError(f"--length {length} is longer than embed-text runs ({buckets[-1]} tokens)",
                             fix=f"pass --length {buckets[-1]} or less")
        return text.program_graphs(cfg), [bert.entry(1, next(b for b in buckets if b >= length))]
    if family in CONFORMER_TYPES:
        o = conformer_asr.ConformerOptions()
        frames = conformer.encoder_buckets(o.window_seconds, o.buckets_seconds)
        return conformer_asr.program_graphs(cfg), [conformer.encoder_entry(next((f for f in frames if f >= length),
                                                                                frames[-1]))]
    if family in ("vit", "dinov2", "dinov2_with_registers", "clip", "resnet"):
        graphs = vision.program_graphs(folder) if folder else [vit.graph(cfg, 1)]
        return graphs, [graphs[0].name]   # batch 1
    if family == "esm":
        buckets = esm.length_buckets(protein.ProteinOptions().max_len + 2)
        if length > buckets[-1]:
            raise UsageError(f"--length {length} is longer than embed runs ({buckets[-1]} tokens)",
                             fix=f"pass --length {buckets[-1]} or less")
        return protein.program_graphs(cfg), [esm.entry(1, next(b for b in buckets if b >= length))]
    raise UsageError(f"bench does not know how to drive a {family!r} model",
                     fix=f"use a whisper, bert, conformer, vision or esm model, or a preset: {sorted(_presets())}")


CONFORMER_TYPES = ("parakeet_ctc", "parakeet_tdt", "parakeet_rnnt", "gigaam")


def _load(model: str):
    """(family, config, weights or None, folder or None)."""
    from sdk import hub
    from sdk.models import module_for
    presets = _presets()
    if model in presets:
        family, cfg = presets[model]
        return family, cfg, None, None
    folder = Path(model) if Path(model).is_dir() else hub.resolve(model).path
    family = _family(folder)
    cfg, weights = module_for(family).load(folder)
    return family, cfg, weights, folder


def _family(folder: Path) -> str:
    """A folder's architecture: its config.json's model_type, else a CTranslate2 Whisper model.bin (faster-whisper
    folders have a config.json without model_type)."""
    from sdk.weights import read_config, read_ctranslate2_spec
    config = read_config(folder) if (folder / "config.json").is_file() else {}
    if isinstance(config, dict) and config.get("model_type"):
        return config["model_type"]
    if (folder / "model.bin").is_file():
        spec = read_ctranslate2_spec(folder / "model.bin")
        if spec == "WhisperSpec":
            return "whisper"
        raise WeightError(f"{folder / 'model.bin'} is a CTranslate2 {spec or 'unnamed'} model, not Whisper",
                          fix="bench runs CTranslate2 models of Whisper only (faster-whisper folders); for other "
                              "architectures pass a Hugging Face folder (config.json + model.safetensors)")
    raise WeightError(f"{folder} is not a model folder: no config.json naming a model_type, and no CTranslate2 "
                      f"Whisper model.bin", fix="pass a Hugging Face model folder or a faster-whisper folder")


def _inputs(graph, rng) -> dict:
    """Synthetic inputs of the right shapes: ids inside their tables, masks of ones, parameters 0."""
    out = {}
    for name, v in graph.values.items():
        if v.kind == "param":
            out[name] = np.int32(0)
        elif v.kind == "input" and v.dtype == "int32":
            rows = [graph.values[n.inputs[0]].shape[0] for n in graph.nodes if n.op == "embedding" and n.inputs[1] == name]
            out[name] = rng.integers(0, min(rows or [2]), v.shape).astype(np.int32)
        elif v.kind == "input":
            out[name] = np.ones(v.shape, np.float32) if "mask" in name else rng.normal(size=v.shape).astype(np.float32)
    return out


@app.command("bench")
@command
def bench(
    model: Annotated[str, typer.Argument(help="model name or folder, or a preset: whisper-small, minilm, vit-b16, "
                                              "esm2-35m")],
    device: Annotated[str, typer.Option("--device", help="auto | npu | emu | cpu: where the counters are measured "
                                                    "($AIE_APPS_DEVICE is not used here)")] = "emu",
    target: TargetOpt = "npu2",
    length: Annotated[int, typer.Option("--length", min=1,
                                        help="sequence length (tokens, residues or feature frames)")] = 128,
    runs: Annotated[int, typer.Option("--runs", min=1, help="measured runs per entry")] = 3,
    estimate_only: Annotated[bool, typer.Option("--estimate-only", help="compile and estimate; run nothing")] = False,
    energy: Annotated[bool, typer.Option("--energy", help="also measure package energy per run (Linux powercap) "
                                                          "on cpu and npu side by side, against idle")] = False,
    json: JsonOpt = False,
):
    """Cost-model estimate for --target, counters measured on --device (emu by default), and with --energy the
    joules per run on the CPU and the NPU."""
    from sdk import compiler
    from sdk.compiler import cost

    if target not in ("npu1", "npu2"):
        raise UsageError(f"unknown target {target!r}", fix="use --target npu1 or --target npu2")
    if energy and estimate_only:
        raise UsageError("--energy measures runs and --estimate-only runs nothing", fix="drop one of the two")
    family, cfg, weights, folder = _load(model)
    graphs, order = _graphs(family, cfg, length, folder)
    program = compiler.compile(graphs, target)
    report = {"model": model, "target": target, "npu_fraction": program.meta["npu_fraction"],
              "estimate": {e: cost.estimate(program, e).as_dict() for e in order}}
    if not estimate_only:
        rng = np.random.default_rng(0)
        if weights is None:
            err(f"note: {model} is a shape preset: running it with random weights")
            weights = {n: (rng.normal(0, 0.02, s)).astype(np.float32)
                       for n, s in _param_shapes(family, cfg).items()}
        inputs = {e: _inputs(next(g for g in graphs if g.name == e), rng) for e in order}
        counter, counter_problem = _open_counter() if energy else (None, None)
        run = functools.partial(_run, graphs, weights, order=order, inputs=inputs, runs=runs)
        measured = {device: run(device, target if device in ("emu", "npu") else None,
                                counter if device in ("cpu", "npu") else None)}
        if energy:
            for other in ENERGY_DEVICES:
                if other not in measured:
                    try:
                        measured[other] = run(other, None, counter)
                    except DeviceUnavailable as e:
                        measured[other] = {"unavailable": e.message}
        mine = measured[device]
        report |= {"device": mine["device"],
                   "measured_per_run": {e: m["counters"] | {"host_wall_ms": round(m["seconds"] / runs * 1e3, 3)}
                                        for e, m in mine["entries"].items()}}
        if energy:
            report["energy"] = _energy_report(measured, counter, counter_problem, runs)
    if json:
        out_json(report)
        return
    _print(report, runs)


ENERGY_DEVICES = ("cpu", "npu")


def _open_counter():
    """(the package energy counter, None), or (None, why it cannot be read)."""
    from sdk.powercap import PackageEnergy
    try:
        return PackageEnergy(), None
    except EnergyCounterUnavailable as e:
        return None, e


def _run(graphs, weights, device: str, target: str | None, counter, *, order, inputs, runs) -> dict:
    """`runs` runs of each entry after one warm-up run, on one session: counters per run, seconds and joules
    for all `runs` (joules None without a counter)."""
    from sdk.session import Session
    with Session(graphs, weights, device=device, target=target) as s:
        state = s.new_state()
        entries = {}
        for entry in order:
            s.run(entry, state, **inputs[entry])  # warm-up (first-run allocations)
            s.counters.reset()
            start = time.perf_counter()
            with counter.measure() if counter else contextlib.nullcontext() as interval:
                for _ in range(runs):
                    s.run(entry, state, **inputs[entry])
            seconds = time.perf_counter() - start
            counts = {k: v / runs for k, v in s.counters.snapshot().items() if k != "runs"}
            entries[entry] = {"counters": counts, "seconds": seconds, "joules": interval.joules if interval else None}
        return {"device": s.report(), "entries": entries}


def _energy_report(measured: dict, counter, problem, runs: int) -> dict:
    """Joules and watts per run on each of ENERGY_DEVICES, and the idle package power over an interval as long
    as the longest measured one (what the package draws anyway: the difference is the work's)."""
    idle = None
    if counter:
        longest = max((m["seconds"] for d in ENERGY_DEVICES for m in measured[d].get("entries", {}).values()),
                      default=0.0)
        with counter.measure() as idle:
            time.sleep(longest)
        out = {"counter": {"available": True, "domains": [d.name for d in counter.domains]},
               "idle": {"seconds": round(idle.seconds, 3), "joules": round(idle.joules, 4),
                        "watts": round(idle.watts, 3)}}
    else:
        out = {"counter": {"available": False, "reason": problem.message, "fix": problem.fix}, "idle": None}
    for d in ENERGY_DEVICES:
        if "unavailable" in measured[d]:
            out[d] = {"unavailable": measured[d]["unavailable"]}
            continue
        rows = {}
        for entry, m in measured[d]["entries"].items():
            joules, seconds = m["joules"], m["seconds"]
            rows[entry] = {"runs": runs, "seconds": round(seconds, 6), "ms_per_run": round(seconds / runs * 1e3, 3),
                           "joules_per_run": None, "joules_per_run_above_idle": None, "package_watts": None}
            if joules is not None:
                rows[entry] |= {"joules_per_run": round(joules / runs, 6),
                                "joules_per_run_above_idle": round((joules - idle.watts * seconds) / runs, 6),
                                "package_watts": round(joules / seconds, 3) if seconds > 0 else 0.0}
        out[d] = {"device": measured[d]["device"], "entries": rows}
    return out


def _ms(value: float) -> str:
    return f"{value:.2f} ms" if value >= 0.1 else f"{value * 1e3:.0f} us"


def _count(n: float, word: str, plural: str = "") -> str:
    return f"{n:g} {word if n == 1 else plural or word + 's'}"


def _print(report: dict, runs: int) -> None:
    target, share = report["target"], report["npu_fraction"]
    print(f"{report['model']} compiled for {target}: {share['ops']:.0%} of its ops and {share['flops']:.0%} of its "
          f"FLOPs on the NPU")
    for entry, est in report["estimate"].items():
        parts = [f"{_ms(est['overhead_ms'])} overhead (launches, syncs, between ops, host steps)"]
        parts += [f"{_ms(est[key])} in kernels bound by {what}"
                  for key, what in (("compute_ms", "compute"), ("memory_ms", "DRAM traffic")) if est[key] > 0]
        print(f"  {entry}: ESTIMATE {est['ms']:.2f} ms on {target} (cost model, not measured): "
              f"{_count(est['dispatches'], 'dispatch', 'dispatches')}, {_count(est['kernels'], 'kernel')}, "
              f"{est['dram_mb']} MB DRAM traffic; {' + '.join(parts)}")
    effective = report.get("device", {}).get("device_effective")
    for entry, m in report.get("measured_per_run", {}).items():
        wall = _ms(m["host_wall_ms"])
        if effective == "cpu":
            print(f"  {entry}: measured on the CPU: {wall} per run (wall time, mean of {runs})")
            continue
        counts = (f"{_count(m['dispatches'], 'dispatch', 'dispatches')}, {_count(m['host_ops'], 'host step')}, "
                  f"{_count(m['syncs'], 'sync')}, {m['bytes_to_device']:g} B to and {m['bytes_from_device']:g} B "
                  f"from the device, {m['weight_bytes_to_device']:g} B of weights re-sent")
        if effective == "emu":
            print(f"  {entry}: emulated, per run: {counts}; {wall} of host time (numpy emulating the NPU, not NPU "
                  f"time)")
        else:
            print(f"  {entry}: measured on the NPU, per run: {counts}; {wall} wall time (mean of {runs})")
    if "energy" in report:
        _print_energy(report["energy"])


def _print_energy(energy: dict) -> None:
    counter = energy["counter"]
    if counter["available"]:
        idle = energy["idle"]
        print(f"energy per run ({' + '.join(counter['domains'])} energy counter; idle baseline {idle['watts']:.2f} W "
              f"over {idle['seconds']:.2f} s):")
    else:
        print(f"energy counter unavailable: {counter['reason']}; timings only:")
        err(f"note: to measure energy: {counter['fix']}")
    short = False
    for d in ENERGY_DEVICES:
        if "unavailable" in energy[d]:
            print(f"  {d}: unavailable: {energy[d]['unavailable']}")
            continue
        for entry, row in energy[d]["entries"].items():
            line = f"  {d} {entry}: {_ms(row['ms_per_run'])} per run"
            if row["joules_per_run"] is not None:
                line += (f", {row['joules_per_run']:.4g} J per run ({row['joules_per_run_above_idle']:.4g} J above "
                         f"idle), {row['package_watts']:.2f} W average package power")
                short |= row["seconds"] < 1.0
            print(line)
    if short:
        err("note: some intervals were shorter than 1 s, where the counter's ~1 ms updates and noise weigh; "
            "raise --runs for steadier figures")


def _param_shapes(family: str, cfg) -> dict:
    from sdk.models import module_for
    return module_for(family).param_shapes(cfg)
