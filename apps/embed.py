"""`aie-apps embed`: protein embeddings from a FASTA file (or stdin) with ESM-2.

Results are written in input order: an .npz (`ids`, `headers`, `lengths`, `layers`, `pooling`, `model`, `run`
(the settings and input hash as JSON) and `embeddings`: [n, hidden], [n, n_layers, hidden] for several layers,
or per-residue rows with `offsets`) or JSON lines. Work is saved batch by batch next to the output
(`OUT.parts/`, each part written atomically), so an interrupted run continues with `--resume` and only embeds
what is missing; the folder goes once OUT is whole. `--resume` after a finished run into an .npz that records
the same run does nothing; it never overwrites an output it cannot tell is the same run.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
import zipfile
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer

from sdk.atomic import atomic_open, write_atomic
from sdk.errors import InputError, UsageError

from .cli import DeviceOpt, app, byte_size, command, err
from .progress import progress

FORMATS = ("npz", "jsonl")


@app.command("embed")
@command
def embed(
    fasta: Annotated[str, typer.Argument(help="FASTA file, or - for stdin")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="write here (.npz or .jsonl); default: JSON lines on stdout")] = None,
    fmt: Annotated[Optional[str], typer.Option("--format", help="npz | jsonl (default: from the -o suffix)")] = None,
    pooling: Annotated[str, typer.Option("--pooling", help="mean (residues only) | cls | per-residue")] = "mean",
    layers: Annotated[str, typer.Option("--layers", help="comma-separated layers, fair-esm style: 0 = embeddings, -1 = last")] = "-1",
    toks_per_batch: Annotated[int, typer.Option("--toks-per-batch", help="token budget per batch, padding included")] = 1024,
    max_len: Annotated[int, typer.Option("--max-len", help="longest sequence in residues")] = 1022,
    on_long: Annotated[str, typer.Option("--on-long", help="longer sequences: truncate | skip | error")] = "truncate",
    max_record: Annotated[Optional[int], typer.Option(
        "--max-record", min=1, help="refuse FASTA records with more residues (default 16777216), before --max-len "
                                    "applies")] = None,
    max_input_size: Annotated[Optional[int], typer.Option(
        "--max-input-size", parser=byte_size, metavar="SIZE",
        help="refuse a FASTA input larger than this (bytes; K, M, G suffixes; default 1G)")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="continue an interrupted run into the same -o")] = False,
    model: Annotated[str, typer.Option("--model", help="esm2_t6_8M_UR50D, facebook/esm2_..., or a folder")] = "esm2_t6_8M_UR50D",
    ray: Annotated[Optional[str], typer.Option("--ray", help="run on a Ray cluster: auto (the running one, else a local one) or HOST:PORT; needs -o")] = None,
    max_errors: Annotated[int, typer.Option("--max-errors", help="with --ray: bad inputs to skip (listed) before the job fails")] = 0,
    device: DeviceOpt = None,
):
    """Embed protein sequences with ESM-2 (fair-esm compatible pooling and layer numbers)."""
    from pipelines.protein import (MAX_FASTA_INPUT, MAX_FASTA_LINE, MAX_FASTA_RECORD, ProteinEmbedder, ProteinOptions,
                                   check_unique_ids, read_fasta, resolve_model_layers)

    if output is not None and output.is_dir():  # esm-extract's habit: an output folder, one file per sequence
        raise UsageError(f"--output {output} is a folder; embed writes one file for all sequences",
                         fix=f"pass a file path, e.g. -o {output / 'embeddings.npz'}")
    fmt = fmt or (output.suffix.lstrip(".") if output is not None else "jsonl")
    if fmt not in FORMATS:
        raise UsageError(f"unknown output format {fmt!r}", fix="use --format npz or jsonl (or -o ending in .npz/.jsonl)")
    if ray is not None and output is None:
        raise UsageError("--ray writes its results to a file", fix="pass -o OUT.npz (or OUT.jsonl)")
    if output is None and (fmt == "npz" or resume):
        raise UsageError("npz output and --resume need a file", fix="pass -o OUT.npz (or OUT.jsonl)")
    if on_long not in ("truncate", "skip", "error"):
        raise UsageError(f"unknown --on-long {on_long!r}", fix="use truncate, skip or error")
    try:
        layer_list = tuple(int(x) for x in layers.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--layers must be comma-separated integers, got {layers!r}", fix="e.g. --layers -1 or 0,6,-1") from None
    options = ProteinOptions(pooling=pooling, layers=layer_list, toks_per_batch=toks_per_batch, max_len=max_len)

    if fasta == "-" and sys.stdin.isatty():
        raise UsageError("FASTA '-' means stdin, but stdin is a terminal", fix="pipe a FASTA file in, or pass its path")
    max_record = max_record or MAX_FASTA_RECORD  # a record may be one line: lines get at least as long
    records = read_fasta(sys.stdin if fasta == "-" else Path(fasta), max_record=max_record,
                         max_line=max(MAX_FASTA_LINE, max_record), max_input=max_input_size or MAX_FASTA_INPUT)
    check_unique_ids(records)
    records = _apply_policies(records, max_len, on_long)
    if not records:
        raise InputError(f"no sequences to embed in {fasta}", fix="pass a FASTA file with at least one sequence")

    source, resolved_layers = resolve_model_layers(model, layer_list)  # config only: no weights read yet
    run = {"model": str(source.path), "pooling": pooling, "layers": list(resolved_layers),
           "max_len": max_len, "on_long": on_long,
           "input": hashlib.sha256("\n".join(f"{r.id}\t{r.sequence}" for r in records).encode()).hexdigest()}
    parts = output.with_name(output.name + ".parts") if output is not None else None
    if resume and output.exists() and not parts.exists():  # a finished run: its parts are gone, OUT is whole
        saved = _saved_run(output) if fmt == "npz" else None  # JSON lines have no place to record the run
        if saved != run:
            what = (f"was made with different settings or input ({', '.join(_changed(saved, run))})" if saved
                    else "does not record the settings it was made with")
            raise UsageError(f"--resume: {output} exists and {what}; embedding again would overwrite it",
                             fix=f"drop --resume to recompute {output.name}, or pick another -o")
        err(f"all {len(records)} sequences are already embedded in {output}")
        return

    if ray is not None:
        _embed_on_ray(records, parts, output, fmt, run, resume, model=model, device=device, options=options,
                      address=ray, max_errors=max_errors)
        return
    embedder = ProteinEmbedder(model, device=device, options=options)
    with _writing(parts, "pass -o in a folder you can write to"):
        done = _prepare_parts(parts, run, resume)
    todo = [r for r in records if r.id not in done]
    if resume and done:
        err(f"resuming: {len(records) - len(todo)} of {len(records)} sequences already embedded")

    start, embedded = time.perf_counter(), len(records) - len(todo)
    try:
        with embedder, progress("embedding", total=len(records), unit="sequences") as update:
            update(embedded)
            for indices, vectors in embedder.embed_batches([r.sequence for r in todo]):
                batch = [todo[i] for i in indices]
                if parts is not None:
                    with _writing(parts, "free disk space, then rerun the same command with --resume"):
                        _write_part(parts, batch, vectors, ragged=pooling == "per-residue")
                else:
                    done.update((r.id, v) for r, v in zip(batch, vectors))
                embedded += len(batch)
                update(embedded)
            report = embedder.report()
    except KeyboardInterrupt:
        if parts is not None and parts.exists():
            err(f"partial results are saved in {parts}; rerun the same command with --resume to finish")
        raise

    results = _read_parts(parts) if parts is not None else done
    vectors = [results[r.id] for r in records]
    if output is None:
        for r, v in zip(records, vectors):
            print(json.dumps(_json_record(r, v, run["layers"])))
    else:
        with _writing(output, f"free disk space or fix permissions, then rerun with --resume (the embeddings "
                              f"are kept in {parts})"):
            _write_atomic(output, fmt, records, vectors, run)
        shutil.rmtree(parts, ignore_errors=True)
    residues = sum(len(r.sequence) for r in records)
    share = f", {report['npu_fraction']['ops']:.0%} of ops in the NPU program" if "npu_fraction" in report else ""
    where = f"; wrote {output}" if output is not None else ""
    err(f"embedded {len(records)} sequences ({residues} residues) with {report['model']} on "
        f"{report['device_effective']} (requested {report['device_requested']}{share}) in {time.perf_counter() - start:.1f} s"
        f"{where}")


def _embed_on_ray(records, parts: Path, output: Path, fmt: str, run: dict, resume: bool, *, model, device, options,
                  address: str, max_errors: int):
    """The same parts, resume and merge as on one machine; a Ray cluster embeds what is missing."""
    from pipelines.batch import ClusterOptions, embed_fasta, require_ray

    require_ray(address)  # before the parts folder exists: without Ray or its cluster it holds a run never started
    with _writing(parts, "pass -o in a folder you can write to"):
        done = _prepare_parts(parts, run, resume)
    todo = [r for r in records if r.id not in done]
    with _writing(parts, "free disk space, then rerun the same command with --resume"):
        report = embed_fasta(todo, lambda batch, vectors: _write_part(parts, batch, vectors,
                                                                      ragged=options.pooling == "per-residue"),
                             model=model, device=device, options=options,
                             cluster=ClusterOptions(address=address, max_errors=max_errors))
    results = _read_parts(parts)
    kept = [r for r in records if r.id in results]  # without the bad inputs --max-errors let through
    with _writing(output, f"free disk space or fix permissions, then rerun with --resume (the embeddings "
                          f"are kept in {parts})"):
        _write_atomic(output, fmt, kept, [results[r.id] for r in kept], run)
    shutil.rmtree(parts, ignore_errors=True)
    err(f"embedded {len(kept)} sequences ({len(records) - len(todo)} from an earlier run); {report.summary()}; "
        f"wrote {output}")


@contextmanager
def _writing(path: Path, fix: str):
    """An OSError while writing results is the user's path or disk, not a crash: an InputError naming it."""
    try:
        yield
    except OSError as e:
        raise InputError(f"cannot write {e.filename or path}: {e.strerror or e}", fix=fix) from None


def _apply_policies(records, max_len: int, on_long: str):
    """Empty records are skipped; longer ones truncated, skipped or refused; each case named on stderr."""
    kept = []
    for r in records:
        if not r.sequence:
            err(f"warning: skipping {r.id} (line {r.line}): no residues")
        elif len(r.sequence) > max_len:
            if on_long == "error":
                raise InputError(f"{r.id} (line {r.line}) has {len(r.sequence)} residues, more than --max-len {max_len}",
                                 fix="raise --max-len, or use --on-long truncate / skip")
            if on_long == "skip":
                err(f"warning: skipping {r.id}: {len(r.sequence)} residues > --max-len {max_len}")
                continue
            err(f"warning: truncating {r.id} from {len(r.sequence)} to {max_len} residues")
            kept.append(replace(r, sequence=r.sequence[:max_len]))
        else:
            kept.append(r)
    return kept


def _prepare_parts(parts: Path | None, run: dict, resume: bool) -> dict:
    """IDs already embedded by an interrupted run with the same settings and input (only with --resume)."""
    if parts is None:
        return {}
    if parts.exists() and not resume:
        raise UsageError(f"{parts} holds partial results of an interrupted run",
                         fix="pass --resume to continue it, or delete that folder to start over")
    if parts.exists():
        saved = _read_run(parts / "run.json")
        if saved == "damaged":  # a full disk left it empty or cut off: the parts cannot be matched to a run
            err(f"warning: {parts / 'run.json'} is damaged, so the saved parts cannot be matched to these settings; "
                f"they are discarded and embedded again")
            shutil.rmtree(parts)
            return _prepare_parts(parts, run, resume)
        if saved != run:
            raise UsageError(f"--resume: {parts} was made with different settings or input "
                             f"({', '.join(_changed(saved, run))})",
                             fix="rerun with the original options and FASTA, or delete that folder to start over")
        return _read_parts(parts)
    parts.mkdir(parents=True)
    write_atomic(parts / "run.json", json.dumps(run))
    return {}


def _read_run(path: Path) -> dict | None | str:
    """The settings an interrupted run recorded; None when it recorded none, "damaged" when unreadable."""
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "damaged"
    return saved if isinstance(saved, dict) else "damaged"


def _changed(saved: dict | None, run: dict) -> list[str]:
    return sorted(k for k in run if (saved or {}).get(k) != run[k])


def _saved_run(output: Path) -> dict | None:
    """The run an existing output was written by, from an .npz's `run` entry; None when it does not say."""
    if not zipfile.is_zipfile(output):  # not an .npz at all
        return None
    try:
        with np.load(output) as d:
            return json.loads(str(d["run"]))
    except (KeyError, ValueError, OSError, zipfile.BadZipFile):  # an .npz from before `run`, or a damaged one
        return None


def _write_part(parts: Path, records, vectors, *, ragged: bool):
    """One batch, written under a temporary name and renamed: a part is either whole or absent."""
    # after the next free number, not the count: a damaged part removed on --resume leaves a gap
    index = max((int(p.stem.split("-")[1]) for p in parts.glob("part-[0-9]*.npz")), default=-1) + 1
    data = np.concatenate(vectors) if ragged else np.stack(vectors)
    rows = np.array([len(v) for v in vectors]) if ragged else np.zeros(0, int)
    with atomic_open(parts / f"part-{index:06d}.npz", "wb") as f:
        np.savez(f, ids=np.array([r.id for r in records]), rows=rows, data=data)


def _read_parts(parts: Path) -> dict:
    out = {}
    for path in sorted(parts.glob("part-*.npz")):
        try:
            with np.load(path) as p:
                ids, rows, data = p["ids"], p["rows"], p["data"]
            whole = (len(rows) == len(ids) and rows.sum() == len(data)) if len(rows) else len(ids) == len(data)
            if not whole:
                raise ValueError("its arrays disagree in length")
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:  # cut off by a full disk
            err(f"warning: {path} is damaged ({e}); its sequences are embedded again")
            path.unlink()
            continue
        if len(rows):  # per-residue: the sequences' rows are concatenated
            out.update(zip(ids.tolist(), np.split(data, np.cumsum(rows)[:-1])))
        else:
            out.update(zip(ids.tolist(), data))
    return out


def _write_atomic(output: Path, fmt: str, records, vectors, run: dict):
    output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(output, "wb" if fmt == "npz" else "w") as f:
        if fmt == "npz":
            meta = dict(ids=np.array([r.id for r in records]), headers=np.array([r.header for r in records]),
                        lengths=np.array([len(r.sequence) for r in records]), layers=np.array(run["layers"]),
                        pooling=np.array(run["pooling"]), model=np.array(run["model"]),
                        run=np.array(json.dumps(run)))  # lets --resume recognise a finished run
            if run["pooling"] == "per-residue":  # ragged: rows of sequence i are offsets[i]:offsets[i+1]
                np.savez(f, **meta, embeddings=np.concatenate(vectors),
                         offsets=np.concatenate([[0], np.cumsum([len(v) for v in vectors])]))
            else:
                np.savez(f, **meta, embeddings=np.stack(vectors))
        else:
            for r, v in zip(records, vectors):
                f.write(json.dumps(_json_record(r, v, run["layers"])) + "\n")


def _json_record(record, vector, layers) -> dict:
    return {"id": record.id, "header": record.header, "length": len(record.sequence), "layers": layers,
            "embedding": np.round(vector.astype(np.float64), 7).tolist()}
