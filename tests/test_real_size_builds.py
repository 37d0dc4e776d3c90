"""Real-size models against the IRON stand-in: one layer of each at its published widths (random weights; the
configs are the checkpoints' own config.json values, written out here, so nothing is downloaded), compiled for
npu1 and npu2, and every distinct kernel step built by its design and checked as tests/test_designs.py checks
the TINY configs (L1, memtile, channels, buffer descriptors and their dimensions, word-sized transfers, the
kernels' signatures, balanced fifos, every output element written). A step either builds within every limit
or is refused with one of the documented refusals (kernels/README.md, "Real sizes"); what each model builds and
refuses is printed (`pytest -s`). The test also holds the catalog to the designs: for every built step, the L1
and memtile bytes the design allocates (counted by the stand-in) are at most the catalog's footprint, which
is within the limits, so the tiling the compiler picks is one the design can allocate."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from sdk.compiler import catalog
from sdk.compiler import compile as compile_graphs
from sdk.compiler.hardware import TARGETS
from sdk.models import bert, clip, conformer, esm, resnet, vit, whisper

from kernels.design_error import DesignError

from . import iron_standin as standin
from .test_designs import (MODELS, agrees_with_catalog, build_step, kernel_steps, name_of,
                           runtime_offsets_in_bounds, runtime_shifted)

# One layer of each model (encoder and decoder for Whisper), at the widths of its checkpoint's config.json.
WHISPER_TINY_EN = dataclasses.replace(
    whisper.TINY, vocab_size=51864, num_mel_bins=80, d_model=384, encoder_layers=1, decoder_layers=1,
    encoder_attention_heads=6, decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536,
    max_source_positions=1500, max_target_positions=448)
MINILM_L6 = bert.Config(vocab_size=30522, hidden_size=384, num_hidden_layers=1, num_attention_heads=12,
                        intermediate_size=1536, max_position_embeddings=512)
CLIP_VIT_B32 = clip.Config(
    dataclasses.replace(clip.TINY.text, vocab_size=49408, hidden_size=512, intermediate_size=2048,
                        num_hidden_layers=1, num_attention_heads=8, max_position_embeddings=77),
    vit.Config("clip", num_hidden_layers=1, hidden_act="quick_gelu", patch_size=32, image_size=224,
               projection_dim=512, layer_norm_eps=1e-5), projection_dim=512)
VIT_BASE = vit.Config("vit", num_hidden_layers=1, num_labels=1000)
RESNET_18 = resnet.Config(hidden_sizes=(64, 128, 256, 512), depths=(1, 1, 1, 1), layer_type="basic", num_labels=1000)
RESNET_50 = resnet.Config(depths=(1, 1, 1, 1), num_labels=1000)
ESM2_8M = dataclasses.replace(esm.PRESETS["esm2_t6_8M_UR50D"], num_hidden_layers=1)
GIGAAM_V2 = conformer.Config.from_dict({  # GigaAM v2 CTC's encoder and head (its hydra config), one layer
    "model_type": "gigaam", "head": {"num_classes": 34},
    "encoder": {"feat_in": 64, "n_layers": 1, "d_model": 768, "subsampling_factor": 4, "ff_expansion_factor": 4,
                "self_attention_model": "rotary", "n_heads": 16, "pos_emb_max_len": 5000, "conv_kernel_size": 31}})
PARAKEET_110M = conformer.Config(hidden_size=512, num_hidden_layers=1, num_attention_heads=8, intermediate_size=2048,
                                 subsampling_conv_channels=256, vocab_size=1025, blank_id=1024)

REAL = {
    "whisper-tiny.en": lambda: whisper.graphs(WHISPER_TINY_EN),
    "minilm-l6": lambda: [bert.graph(MINILM_L6, 1, 128)],
    "clip-vit-b32": lambda: [clip.image_graph(CLIP_VIT_B32, 2), clip.text_graph(CLIP_VIT_B32, 3, 77)],
    "vit-base": lambda: [vit.graph(VIT_BASE, 1)],
    "resnet-18": lambda: [resnet.graph(RESNET_18, 1)],
    "resnet-50": lambda: [resnet.graph(RESNET_50, 1)],
    "esm2-8m": lambda: [esm.graph(ESM2_8M, 1, 256)],
    "parakeet-110m": lambda: [conformer.encoder_graph(PARAKEET_110M, 400)],
}

# What still fails at real size, each documented in kernels/README.md ("Real sizes"): (models, targets, design,
# message). A DesignError is a refusal; the others are checks a built design still fails. Anything else fails the
# test; a gap that no longer occurs is printed as fixed.
# None at present: Whisper's first conv1d goes in windows of columns (kernels/conv2d width chunks), and a batched
# bmm's row tile within a slice agrees with the catalog's (catalog.tiling).
REAL_SIZE_GAPS: list[tuple[set, set, str, str]] = []


def documented(model, target, design, message) -> str | None:
    return next((pattern for models, targets, d, pattern in REAL_SIZE_GAPS
                 if model in models and target in targets and d == design and re.search(pattern, message)), None)


# The kinds whose tiling the catalog picks by a footprint that bounds the design's allocation (and conv2d, whose
# blocks and band chunks stay within the catalog's CONV_L1). dwconv1d, pool and transpose size their own bands and
# blocks within the limits (standin.check holds them to those).
CATALOG_EXACT = ("gemm", "bmm", "mha", "eltwise", "norm", "softmax", "reduce", "rope", "maskgen", "argmax")


def written_once(step, rec, params) -> list[str]:
    """Every output element written; once, except by GEMM / GEMV (a recomputed last tile, repeated rows) and by an
    `mha` whose query tile does not divide Tq: its last tile shifts back to end at Tq, so exactly the rows it shares
    with the tile before are written twice, with the same bytes (test_kernels'
    test_mha_shifted_last_query_tile_rewrites_identical_bytes)."""
    found, out_index = [], len(rec.runtime.data) - len(step.outputs)
    for i, name in enumerate(step.outputs):
        if runtime_shifted(rec, out_index + i):
            continue
        hits = standin.written(rec, out_index + i)
        expected = np.ones_like(hits)
        if name_of(step) == "mha":
            expected = mha_cover(step, params, hits.size)
        if (hits < 1).any() or name_of(step) not in ("gemm", "gemv") and (hits != expected).any():
            found.append(f"output {name}: {int((hits < 1).sum())} elements never written, "
                         f"{int((hits > 1).sum())} written more than once")
    return found


def mha_cover(step, params, elements) -> np.ndarray:
    """How many of the design's query tiles cover each output element: tiles of tq rows from 0, the last one
    shifted back to end at Tq; in the stored order, [B, T, H, D] when the heads are interleaved (stored_perm)."""
    tq, d, heads = params["tq"], params["d"], params["heads"]
    Tq = elements // (heads * d)
    cover = np.zeros(Tq, np.int64)
    for i in range(-(-Tq // tq)):
        s = min(i * tq, Tq - tq)
        cover[s:s + tq] += 1
    if "stored_perm" in step.attrs:
        return np.broadcast_to(cover[None, :, None], (params["batch"], Tq, heads // params["batch"] * d)).reshape(-1)
    return np.broadcast_to(cover[None, :, None], (heads, Tq, d)).reshape(-1)


def beyond_footprint(step, rec, hw) -> list[str]:
    """The design's L1 and memtile bytes (the stand-in's count) against the catalog's footprint and the limits."""
    if step.op not in CATALOG_EXACT and name_of(step) != "conv2d":
        return []
    f = catalog.footprint(step.op, step.attrs["tiling"], hw)
    l1, mem = max(standin.l1_use(rec).values(), default=0), max(standin.memtile_use(rec).values(), default=0)
    found = []
    if not l1 <= f.l1 <= hw.l1_bytes:
        found.append(f"allocates {l1} bytes of L1, the catalog counts {f.l1} (limit {hw.l1_bytes})")
    if not mem <= f.memtile <= hw.memtile_bytes:
        found.append(f"allocates {mem} bytes of memtile, the catalog counts {f.memtile} (limit {hw.memtile_bytes})")
    return found


@pytest.mark.parametrize("target", ("npu2", "npu1"))
def test_catalog_footprint_bounds_what_the_designs_allocate(target):
    """Every built step of the TINY configs (tests/test_designs.py's MODELS): allocated <= footprint <= limit, so
    a tiling the catalog accepts is one the design can allocate."""
    hw, found, checked = TARGETS[target], [], 0
    for model in sorted(MODELS):
        program = compile_graphs(MODELS[model](), target)
        for step in distinct_steps(program):
            if step.op not in CATALOG_EXACT and name_of(step) != "conv2d":
                continue
            try:
                rec, _ = build_step(step, program, target)
            except DesignError:
                continue  # test_designs holds every refusal to the documented ones
            checked += 1
            found += [f"{model} {name_of(step)} {step.attrs.get('name')}: {p}" for p in beyond_footprint(step, rec, hw)]
    assert checked > 100 and not found, "\n".join(found[:10])


def distinct_steps(program):
    """One step per distinct (design, tiling, operand buffers' shapes and dtypes, views): the layers repeat."""
    seen, steps = set(), []
    for s in kernel_steps(program):
        key = (name_of(s), repr(s.attrs["tiling"]), repr(s.attrs.get("views")), repr(s.attrs.get("chain")),
               tuple((program.buffers[b].shape, program.buffers[b].dtype) if b else None
                     for b in (*s.inputs, *s.outputs)))
        if key not in seen:
            seen.add(key)
            steps.append(s)
    return steps


@pytest.mark.slow
@pytest.mark.parametrize("target", ("npu2", "npu1"))
@pytest.mark.parametrize("model", sorted(REAL))
def test_real_size_steps_build_or_are_documented_refusals(model, target):
    program = compile_graphs(REAL[model](), target)
    hw = TARGETS[target]
    built, refused, failing, failing_steps, failures = 0, {}, {}, 0, []
    for step in distinct_steps(program):
        label, design = f"{name_of(step)} {step.attrs.get('name')}", name_of(step)
        try:
            rec, params = build_step(step, program, target)
        except DesignError as e:
            gap = documented(model, target, design, e.message)
            refused[gap or e.message[:70]] = refused.get(gap or e.message[:70], 0) + 1
            if gap is None:
                failures.append(f"{label}: refused: {e.message}")
            continue
        problems = standin.check(rec, hw) + agrees_with_catalog(step, params) + written_once(step, rec, params)
        problems += runtime_offsets_in_bounds(rec, params, design in ("gemm", "gemv"))
        problems += beyond_footprint(step, rec, hw)
        if not problems:
            built += 1
            continue
        gaps = {documented(model, target, design, p) for p in problems}
        if None in gaps:
            failures.append(f"{label}: " + "; ".join(p for p in problems if documented(model, target, design, p)
                                                    is None)[:400])
        for gap in gaps - {None}:
            failing[gap] = failing.get(gap, 0) + 1
        failing_steps += 1
    seen = set(refused) | set(failing)
    fixed = [g for models, targets, _, g in REAL_SIZE_GAPS if model in models and target in targets and g not in seen]
    print(f"\n  {model} {target}: {built} distinct steps built, {sum(refused.values())} refused {refused}, "
          f"{failing_steps} failing documented checks {failing}"
          + (f"; no longer seen: {fixed}" if fixed else ""), end="")
    assert not failures, "\n".join(failures[:12])


# Attention steps of the buckets the pipelines compile beyond REAL's one shape each, whose transfers, all at once,
# would hold more buffer descriptors than a shim has (kernels/README.md, "Real sizes"): rope's rows and mha's key
# blocks go in task groups, and the stand-in refuses a 17th descriptor live on one shim while a design builds.
ATTENTION_BUCKETS = {
    "esm2-8m b16_t64": lambda: esm.graph(ESM2_8M, 16, 64),       # rope: 66 live at once in one group
    "esm2-8m b2_t512": lambda: esm.graph(ESM2_8M, 2, 512),       # mha: 512 keys under a key mask
    "gigaam-v2 t126": lambda: conformer.encoder_graph(GIGAAM_V2, conformer.frames_for(5.0)),  # rope: 34 (npu1 65)
    # mha over 501 keys in blocks of 3 and 751 (a prime) in blocks of 1: within MAX_TRANSFERS because the key
    # mask is one transfer per work item (kernels/mha/design.py), not one per (pass, key block)
    "gigaam-v2 t501": lambda: conformer.encoder_graph(GIGAAM_V2, conformer.frames_for(20.0)),
    "gigaam-v2 t751": lambda: conformer.encoder_graph(GIGAAM_V2, conformer.frames_for(30.0)),
}


@pytest.mark.slow
@pytest.mark.parametrize("target", ("npu2", "npu1"))
@pytest.mark.parametrize("bucket", sorted(ATTENTION_BUCKETS))
def test_real_size_attention_buckets_build_within_the_shim_descriptors(bucket, target):
    program = compile_graphs([ATTENTION_BUCKETS[bucket]()], target)
    hw, built, failures = TARGETS[target], [], []
    for step in distinct_steps(program):
        if name_of(step) not in ("rope", "mha"):
            continue
        rec, params = build_step(step, program, target)
        problems = standin.check(rec, hw) + agrees_with_catalog(step, params) + written_once(step, rec, params)
        problems += beyond_footprint(step, rec, hw)
        failures += [f"{name_of(step)} {step.attrs.get('name')}: {p}" for p in problems]
        built.append(f"{name_of(step)} {max(rec.runtime.peak.values())}")
    print(f"\n  {bucket} {target}: peak live shim descriptors {built}", end="")
    assert {b.split()[0] for b in built} == {"rope", "mha"} and not failures, "\n".join(failures[:12])
