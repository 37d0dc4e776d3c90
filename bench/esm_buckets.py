"""What embed's static shapes cost on the cpu backend (esm.length_buckets / esm.batch_sizes): a protein at its own
length vs padded to its bucket, and one sequence per run vs the bucket's full batch, per sequence.

    python bench/esm_buckets.py                       # ESM-2 8M shape, random weights, 2 threads
    python bench/esm_buckets.py --preset esm2_t12_35M_UR50D --threads 1
    python bench/esm_buckets.py --lengths "" --toks-per-batch 4096   # fair-esm's batches, for comparison
Padding is masked, so the embeddings are the same either way (tests/test_esm.py); only the time differs.
"""
from __future__ import annotations

import argparse

from harness import compare, print_table, threads

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--preset", default="esm2_t6_8M_UR50D")
parser.add_argument("--lengths", default="40,100,200,400,700", help="token lengths (<cls> + residues + <eos>); "
                                                                     "empty: batches only")
parser.add_argument("--toks-per-batch", type=int, default=None, help="default: embed's (ProteinOptions)")
args = parser.parse_args()
threads(args.threads)  # before numpy loads its thread pool

import numpy as np  # noqa: E402

from pipelines.protein import ProteinOptions  # noqa: E402
from sdk.models import esm  # noqa: E402
from sdk.session import Session  # noqa: E402


def runner(session: Session, batch: int, length: int, tokens: int):
    """One run of entry (batch, length) holding `tokens` real tokens per row, the rest masked padding."""
    rng = np.random.default_rng(0)
    ids = np.full((batch, length), 1, np.int32)
    ids[:, :tokens] = rng.integers(4, 24, (batch, tokens))
    mask = np.zeros((batch, length), np.float32)
    mask[:, :tokens] = 1.0
    return lambda: session.run(esm.entry(batch, length), ids=ids, mask=mask)


def main():
    cfg = esm.PRESETS[args.preset]
    options = ProteinOptions(**({"toks_per_batch": args.toks_per_batch} if args.toks_per_batch else {}))
    buckets = esm.length_buckets(options.max_len + 2)
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    shapes = {(1, t) for t in lengths} | {(b, t) for t in buckets for b in esm.batch_sizes(t, options.toks_per_batch)}
    rng = np.random.default_rng(0)
    weights = {k: (rng.standard_normal(s) * 0.02).astype(np.float32) for k, s in esm.param_shapes(cfg).items()}
    session = Session([esm.graph(cfg, b, t) for b, t in sorted(shapes)], weights, device="cpu")
    for t in lengths:
        bucket = next(b for b in buckets if b >= t)
        padded = f"padded to {bucket}"
        samples = compare({"own length": runner(session, 1, t, t), padded: runner(session, 1, bucket, t)},
                          block_s=0.3, min_blocks=5)
        print_table(f"{args.preset} shape, one sequence of {t} tokens: own length vs its bucket", samples,
                    ours=padded)
    for t in buckets:
        full = max(esm.batch_sizes(t, options.toks_per_batch))
        if full > 1:
            one, batched = runner(session, 1, t, t), runner(session, full, t, t)
            name = f"batch {full}"
            samples = compare({"batch 1": one, name: batched}, block_s=0.3, min_blocks=5)
            samples[name] = [s / full for s in samples[name]]
            print_table(f"{args.preset} shape, {t} tokens: per sequence, batch 1 vs batch {full}", samples,
                        ours=name)


if __name__ == "__main__":
    main()
