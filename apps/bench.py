"""`aie-apps bench MODEL`: what one run of each entry of a model costs on the NPU.

Two different things, labelled as such:
- the cost model's ESTIMATE of the latency on --target (npu1 | npu2), from the compiled program;
- counters MEASURED on the backend (--device emu: dispatches, host<->device syncs and bytes, weight bytes per
  run), and the backend's host wall time (on emu that is numpy emulating the NPU, not NPU time).

MODEL is a model name or folder (real weights: all-MiniLM-L6-v2, whisper-tiny.en, ...) or one of the shape
presets below (random weights; for estimates at real sizes: whisper-small, minilm, vit-b16, esm2-35m).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from sdk.errors import UsageError

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


def _graphs(family: str, cfg, length: int):
    """The graphs a benchmark runs, and the entries in run order (one shared state)."""
    from sdk.models import bert, clip, conformer, esm, resnet, vit, whisper
    if family == "whisper":
        return whisper.graphs(cfg), ["encode", "decode_step"]
    builders = {"bert": lambda: bert.graph(cfg, 1, length), "esm": lambda: esm.graph(cfg, 1, length),
                "vit": lambda: vit.graph(cfg, 1), "dinov2": lambda: vit.graph(cfg, 1),
                "dinov2_with_registers": lambda: vit.graph(cfg, 1), "clip": lambda: clip.image_graph(cfg, 1),
                "resnet": lambda: resnet.graph(cfg, 1),
                **{t: (lambda: conformer.encoder_graph(cfg, length))
                   for t in ("parakeet_ctc", "parakeet_tdt", "parakeet_rnnt", "gigaam")}}
    if family not in builders:
        raise UsageError(f"bench does not know how to drive a {family!r} model",
                         fix=f"use one of {sorted(builders) + ['whisper']}, or a preset: {sorted(_presets())}")
    longest = getattr(cfg, "max_position_embeddings", None)
    if family in ("bert", "esm") and longest is not None and length > longest:
        raise UsageError(f"--length {length} is longer than this model's {longest} positions",
                         fix=f"pass --length {longest} or less")
    g = builders[family]()
    return [g], [g.name]


def _load(model: str):
    """(family, config, weights or None)."""
    from sdk import hub
    from sdk.models import module_for
    from sdk.weights import read_config
    presets = _presets()
    if model in presets:
        family, cfg = presets[model]
        return family, cfg, None
    folder = Path(model) if Path(model).is_dir() else hub.resolve(model).path
    # the config names the architecture; only a CTranslate2 folder (its config.json has no model_type) is
    # recognised by its model.bin, whose own reader then checks that it is a Whisper model
    family = read_config(folder).get("model_type") or ("whisper" if (folder / "model.bin").exists() else "")
    cfg, weights = module_for(family).load(folder)
    return family, cfg, weights


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
    json: JsonOpt = False,
):
    """Cost-model estimate for --target, and counters measured on --device (emu by default)."""
    from sdk import compiler
    from sdk.compiler import cost
    from sdk.session import Session

    if target not in ("npu1", "npu2"):
        raise UsageError(f"unknown target {target!r}", fix="use --target npu1 or --target npu2")
    family, cfg, weights = _load(model)
    graphs, order = _graphs(family, cfg, length)
    program = compiler.compile(graphs, target)
    report = {"model": model, "target": target, "npu_fraction": program.meta["npu_fraction"],
              "estimate": {e: cost.estimate(program, e).as_dict() for e in order}}
    if not estimate_only:
        rng = np.random.default_rng(0)
        if weights is None:
            err(f"note: {model} is a shape preset: running it with random weights")
            weights = {n: (rng.normal(0, 0.02, s)).astype(np.float32)
                       for n, s in _param_shapes(family, cfg).items()}
        with Session(graphs, weights, device=device, target=target if device in ("emu", "npu") else None) as s:
            state = s.new_state()
            measured = {}
            for entry in order:
                g = next(g for g in graphs if g.name == entry)
                inputs = _inputs(g, rng)
                s.run(entry, state, **inputs)  # warm-up (first-run allocations)
                s.counters.reset()
                start = time.perf_counter()
                for _ in range(runs):
                    s.run(entry, state, **inputs)
                wall = (time.perf_counter() - start) / runs
                c = s.counters.snapshot()
                measured[entry] = {k: v / runs for k, v in c.items() if k != "runs"} | {
                    "host_wall_ms": round(wall * 1e3, 3)}
            report |= {"device": s.report(), "measured_per_run": measured}
    if json:
        out_json(report)
        return
    print(f"{model} on {target}: NPU share {program.meta['npu_fraction']['ops']:.0%} of ops, "
          f"{program.meta['npu_fraction']['flops']:.0%} of FLOPs")
    for entry, est in report["estimate"].items():
        print(f"  {entry}: ESTIMATE {est['ms']:.2f} ms on {target} (cost model, not measured): {est['dispatches']} "
              f"dispatch(es), {est['kernels']} kernels, {est['dram_mb']} MB DRAM traffic; overhead "
              f"{est['overhead_ms']} ms, compute {est['compute_ms']} ms, memory {est['memory_ms']} ms")
    for entry, m in report.get("measured_per_run", {}).items():
        label = "emulated" if device == "emu" else device
        print(f"  {entry}: measured on {label} per run: {m['dispatches']:g} dispatch(es), {m['host_ops']:g} host ops, "
              f"{m['syncs']:g} syncs, {m['bytes_to_device']:g} B to device, {m['bytes_from_device']:g} B from device, "
              f"{m['weight_bytes_to_device']:g} weight B; host wall {m['host_wall_ms']} ms "
              f"({'numpy emulation, not NPU time' if device == 'emu' else 'host time'})")


def _param_shapes(family: str, cfg) -> dict:
    from sdk.models import module_for
    return module_for(family).param_shapes(cfg)
