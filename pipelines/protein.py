"""Protein embeddings with ESM-2: FASTA in, one vector (or one per residue) per sequence out.

    from sdk import ProteinEmbedder
    with ProteinEmbedder("esm2_t6_8M_UR50D") as embedder:
        vectors = embedder.embed(["MKTAYIAKQR", "GSHMLEDPVDAFQA"])   # [2, hidden]

Static shapes: sequences are sorted by length, padded to a length bucket (64, 128, ... 1024 tokens) and run in
batches of `toks_per_batch` // bucket rows or one at a time (fair-esm's batching, on the fixed shapes of
esm.program_graphs: the one session holds them all, and `aie-apps build` compiles exactly those). Padding is
masked inside attention and excluded from pooling, so a sequence's embedding never depends on what it was
batched with.
Pooling and layers follow fair-esm's `extract.py`: `mean` averages the residues only (not <cls>, <eos> or
padding), `cls` is the <cls> position, `per-residue` keeps one row per residue; layer 0 is the embedding
output, negative layers count from the last.
"""
from __future__ import annotations

import io
import numbers
import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, TextIO

import numpy as np

from sdk import hub
from sdk.errors import InputError, ModelNotFound, UsageError, WeightError
from sdk.models import esm
from sdk.runtime import choose_device
from sdk.session import Session
from sdk.vocab import read_vocabulary
from sdk.weights import read_config

DEFAULT_MODEL = "esm2_t6_8M_UR50D"
POOLINGS = ("mean", "cls", "per-residue")
ON_LONG = ("truncate", "error")

# The fixed ESM-2 alphabet, in id order (fair-esm's Alphabet "ESM-1b" / the vocab.txt of facebook/esm2_*).
ALPHABET = ("<cls>", "<pad>", "<eos>", "<unk>", *"LAGVSERTIDPKQNFYMHWCXBUZO.-", "<null_1>", "<mask>")


class EsmTokenizer:
    """Sequences -> ids: <cls> residues <eos>. Lower case is accepted, letters outside the alphabet (J) become
    <unk>, special tokens may be written inline (`<mask>`); anything else is an InputError with its position."""

    def __init__(self):
        self.ids = {tok: i for i, tok in enumerate(ALPHABET)}
        self.cls, self.pad, self.eos = self.ids["<cls>"], self.ids["<pad>"], self.ids["<eos>"]
        self.unk, self.mask = self.ids["<unk>"], self.ids["<mask>"]
        lut = np.full(256, -1, np.int32)
        for c in range(ord("A"), ord("Z") + 1):
            lut[c] = lut[c + 32] = self.ids.get(chr(c), self.unk)
        lut[ord(".")], lut[ord("-")] = self.ids["."], self.ids["-"]
        self._lut = lut

    @classmethod
    def for_model(cls, folder: Path) -> "EsmTokenizer":
        """The tokenizer, after checking that the model's vocab.txt (when it ships one) is the ESM-2 alphabet."""
        vocab = Path(folder) / "vocab.txt"
        if vocab.exists() and tuple(t.strip() for t in read_vocabulary(vocab) if t.strip()) != ALPHABET:
            raise WeightError(f"{vocab} is not the 33-token ESM-2 alphabet",
                              fix="use an ESM-2 checkpoint (facebook/esm2_*) with its own vocab.txt")
        return cls()

    def encode(self, sequence: str) -> np.ndarray:
        parts = re.split(r"(<[a-z_0-9]+>)", sequence) if "<" in sequence else [sequence]
        out, offset = [np.array([self.cls], np.int32)], 0
        for part in parts:
            if part.startswith("<") and part in self.ids:
                out.append(np.array([self.ids[part]], np.int32))
                offset += 1
                continue
            if part:
                raw = np.frombuffer(part.encode("utf-8", "replace"), np.uint8)
                ids = self._lut[raw]
                if (ids < 0).any() or len(raw) != len(part):
                    pos = next(i for i, ch in enumerate(part) if ord(ch) > 127 or self._lut[ord(ch)] < 0)
                    raise InputError(f"invalid character {part[pos]!r} at residue {offset + pos + 1} of the sequence",
                                     fix="sequences are amino-acid letters (any case), '-', '.' or tokens such as "
                                         "<mask>; remove other characters")
                out.append(ids)
            offset += len(part)
        out.append(np.array([self.eos], np.int32))
        return np.concatenate(out)


# ---- FASTA ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Record:
    id: str        # first word of the header, safe as a file name
    header: str    # the whole header line without '>'
    sequence: str  # upper case, no whitespace, no terminal '*'
    line: int      # line number of the header (1-based), for messages


_FASTA_RESIDUE = re.compile(r"[A-Za-z.\-]*")


def sanitize_id(word: str) -> str:
    """Header word -> ID usable as a file name: only letters, digits, '.', '_' and '-', no leading dot."""
    return re.sub(r"^\.", "_", re.sub(r"[^A-Za-z0-9._-]", "_", word))


# Input bounds (parameters of read_fasta): titin, the longest protein, has ~35,000 residues; these stop
# /dev/zero, a genome on one line or a runaway pipe with an InputError instead of exhausting memory.
MAX_FASTA_LINE = 1 << 24       # characters in one line
MAX_FASTA_RECORD = 1 << 24     # residues in one record
MAX_FASTA_INPUT = 1 << 30      # characters in the whole input


def read_fasta(source: str | Path | TextIO, *, max_line: int = MAX_FASTA_LINE, max_record: int = MAX_FASTA_RECORD,
               max_input: int = MAX_FASTA_INPUT) -> list[Record]:
    """Records of a FASTA file (a path, '-' is not special here, or an open text stream).

    Tolerates blank lines, CRLF, lower case, spaces inside sequence lines, ';' comment lines and a '*'
    terminator; records without residues are returned with an empty sequence. Anything else (digits,
    punctuation, an internal '*', residues before the first header) is an InputError naming the record, its
    line and the residue position. Records that look like DNA or RNA are read, with a warning naming them.
    The input is read line by line within the bounds above (an InputError past any of them)."""
    limits = (max_line, max_record, max_input)
    if isinstance(source, (str, Path)):
        try:
            with open(source, encoding="utf-8", newline=None) as f:
                records = _parse_fasta(f, *limits)
        except OSError as e:
            raise InputError(f"cannot read {source}: {e.strerror}", fix="check the FASTA path") from None
    elif not isinstance(source, Iterable) or isinstance(source, (bytes, io.BufferedIOBase, io.RawIOBase)):
        raise UsageError(f"read_fasta takes a path or a text stream, got {type(source).__name__}",
                         fix="pass the file's path, or open it in text mode (open(path) without 'b')")
    else:
        records = _parse_fasta(source, *limits)
    # ESM-2 embeds nucleotide letters as amino acids without complaint, into meaningless vectors; only a
    # warning, since short peptides of these letters (ACGT) are real proteins
    nucleotides = [r.id for r in records if _looks_like_nucleotides(r.sequence)]
    if nucleotides:
        shown = ", ".join(nucleotides[:5]) + (", ..." if len(nucleotides) > 5 else "")
        warnings.warn(f"{len(nucleotides)} of {len(records)} records look like nucleotide (DNA/RNA) sequences, not "
                      f"protein: {shown}; ESM-2 expects amino-acid sequences (its embeddings of DNA or RNA are "
                      f"meaningless), so translate them first, e.g. with `seqkit translate`", stacklevel=2)
    return records


def _looks_like_nucleotides(sequence: str) -> bool:
    """At least 20 letters, 90% or more of them A, C, G, T, U or N (gaps ignored). Upper-case input."""
    letters = len(sequence) - sequence.count("-") - sequence.count(".")
    return letters >= 20 and sum(sequence.count(c) for c in "ACGTUN") >= 0.9 * letters


def _bounded_lines(source, max_line: int, max_input: int):
    """The lines of a text stream (read with a length limit, so a line without an end cannot grow without
    bound) or of any other iterable of strings."""
    lines = iter(lambda: source.readline(max_line + 1), "") if hasattr(source, "readline") else source
    total = 0
    for number, line in enumerate(lines, 1):
        total += len(line)
        if len(line.rstrip("\r\n")) > max_line:
            raise InputError(f"line {number} of the FASTA input is longer than {max_line:,} characters",
                             fix="is it a binary file? (wrap long sequences; `embed --max-record` raises this limit too, "
                                 "read_fasta(max_line=) in the SDK)")
        if total > max_input:
            raise InputError(f"the FASTA input is longer than {max_input:,} characters",
                             fix="split it into smaller files (e.g. `seqkit split`), or raise the limit: `embed "
                                 "--max-input-size 4G` (read_fasta(max_input=) in the SDK)")
        yield number, line


def _parse_fasta(source: TextIO, max_line: int, max_record: int, max_input: int) -> list[Record]:
    records: list[Record] = []
    header, start, chunks, terminated, residues = None, 0, [], False, 0

    def finish():
        if header is not None:
            word = header.split()[0] if header.split() else ""
            records.append(Record(sanitize_id(word) or f"record_line{start}", header, "".join(chunks).upper(),
                                  start))

    try:
        for number, line in _bounded_lines(source, max_line, max_input):
            line = line.rstrip("\r\n").lstrip("\ufeff") if number == 1 else line.rstrip("\r\n")
            if line.startswith(">"):
                finish()
                header, start, chunks, terminated, residues = line[1:].strip(), number, [], False, 0
                continue
            text = "".join(line.split())
            if not text or line.startswith(";"):
                continue
            where = f"record {header.split()[0] if header and header.split() else '?'!r} (header on line {start})"
            if header is None:
                raise InputError(f"line {number}: sequence data before the first '>' header",
                                 fix="a FASTA file starts with a '>' header line")
            if terminated:
                raise InputError(f"{where}: residues after the '*' terminator on line {number}",
                                 fix="'*' may only end a sequence; remove it or split the record")
            if text.endswith("*"):
                text, terminated = text[:-1], True
            bad = _FASTA_RESIDUE.match(text).end()
            if bad < len(text):
                position = sum(len(c) for c in chunks) + bad + 1
                raise InputError(f"{where}: invalid character {text[bad]!r} at residue {position} (line {number})",
                                 fix="sequences may contain amino-acid letters, '-', '.' and a final '*' only")
            residues += len(text)
            if residues > max_record:
                raise InputError(f"{where} has more than {max_record:,} residues",
                                 fix="ESM-2 reads at most a few thousand; for more, raise the limit: `embed --max-record N` "
                                     "(read_fasta(max_record=) in the SDK)")
            chunks.append(text)
    except UnicodeDecodeError as e:
        raise InputError(f"the FASTA input is not UTF-8 text: {e.reason}", fix="pass a plain-text FASTA file") from None
    finish()
    return records


def check_unique_ids(records: Iterable[Record]) -> None:
    """Duplicate IDs would overwrite each other's results: refuse them up front, all listed at once."""
    seen: dict[str, list[int]] = {}
    for r in records:
        seen.setdefault(r.id, []).append(r.line)
    dups = {k: v for k, v in seen.items() if len(v) > 1}
    if dups:
        shown = "; ".join(f"{k} (lines {', '.join(map(str, v))})" for k, v in list(dups.items())[:10])
        raise InputError(f"{len(dups)} duplicate sequence ID(s): {shown}",
                         fix="make the first word of every header unique (IDs are sanitised: '/' and other "
                             "characters become '_')")


# ---- static shapes ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Batch:
    indices: tuple[int, ...]  # positions of the sequences in the caller's list
    batch: int                # static batch size (>= len(indices); the rest are filler rows)
    length: int               # static token length (a bucket)


def plan_batches(token_lengths: list[int], buckets: tuple[int, ...], toks_per_batch: int) -> list[Batch]:
    """Sort by length, bucket, and pack toks_per_batch // bucket rows per batch (esm.batch_sizes). A bucket's
    last, partial batch runs at that full size when it is at least half full (filler rows cost under 2x),
    otherwise one sequence per run."""
    order = sorted(range(len(token_lengths)), key=lambda i: token_lengths[i])
    by_bucket: dict[int, list[int]] = {}
    for i in order:
        by_bucket.setdefault(next(b for b in buckets if b >= token_lengths[i]), []).append(i)
    batches = []
    for length, members in by_bucket.items():
        cap = max(esm.batch_sizes(length, toks_per_batch))
        for start in range(0, len(members), cap):
            chunk = tuple(members[start:start + cap])
            if 2 * len(chunk) >= cap:
                batches.append(Batch(chunk, cap, length))
            else:
                batches += [Batch((i,), 1, length) for i in chunk]
    return batches


# ---- the embedder --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProteinOptions:
    pooling: str = "mean"            # mean | cls | per-residue
    layers: tuple[int, ...] = (-1,)  # fair-esm repr_layers: 0 = embeddings, -1 = last
    # token budget per batch, padding included (at least one sequence each). fair-esm uses 4096; 1024 runs
    # faster per sequence on the cpu backend (bench/esm_buckets.py) and keeps each NPU program small
    toks_per_batch: int = 1024
    max_len: int = 1022              # residues; ESM-2 was trained on 1022 + <cls> + <eos>
    on_long: str = "truncate"        # truncate (with a warning) | error

    def __post_init__(self):
        if self.pooling not in POOLINGS:
            raise UsageError(f"unknown pooling {self.pooling!r}", fix=f"use one of {', '.join(POOLINGS)}")
        if self.on_long not in ON_LONG:
            raise UsageError(f"unknown on_long {self.on_long!r}", fix=f"use one of {', '.join(ON_LONG)}")
        if not isinstance(self.layers, (tuple, list)) or not all(
                isinstance(k, numbers.Integral) and not isinstance(k, bool) for k in self.layers):
            raise UsageError(f"layers must be a tuple of layer numbers, got {self.layers!r}",
                             fix="e.g. layers=(-1,) for the last layer, or (0, 6, -1)")
        if not self.layers:
            raise UsageError("no layers selected", fix="pass at least one layer, e.g. -1")
        if self.max_len < 1 or self.toks_per_batch < 1:
            raise UsageError(f"max_len ({self.max_len}) and toks_per_batch ({self.toks_per_batch}) must be positive",
                             fix="pass positive values (a sequence longer than the budget gets a batch of its own)")


def program_graphs(cfg: esm.Config, options: ProteinOptions = ProteinOptions()) -> list:
    """The graphs a ProteinEmbedder with these options runs (its one session): what `aie-apps build` compiles."""
    return esm.program_graphs(cfg, options.layers, options.max_len + 2, options.toks_per_batch)


def resolve_model(name: str) -> hub.ModelSource:
    """fair-esm names (esm2_t6_8M_UR50D) and Hugging Face ids (facebook/esm2_t6_8M_UR50D) both resolve."""
    repo = f"facebook/{name}" if re.fullmatch(r"esm\w+_UR\d+\w*", name) else name
    try:
        return hub.resolve(repo)
    except ModelNotFound as e:
        if not repo.startswith("facebook/esm"):
            raise
        raise ModelNotFound(
            e.message, fix=f"no ESM-2 weights ship with any offline package: fetch them once while online "
                           f"(`huggingface-cli download {repo} config.json model.safetensors vocab.txt`) and pass the "
                           f"folder as --model PATH, or run online so the Hugging Face cache is filled") from None


def resolve_model_layers(model: str, layers: Iterable[int]) -> tuple[hub.ModelSource, tuple[int, ...]]:
    """The model's folder and the layer numbers `layers` name in it (duplicates dropped), from its config.json
    alone: what a run embeds with, known without reading the weights."""
    source = resolve_model(model)
    config = read_config(source.path)
    if config.get("model_type") != "esm":
        raise UsageError(f"{source.path} holds a {config.get('model_type')!r} model, not ESM-2",
                         fix="pass an ESM-2 model (e.g. esm2_t6_8M_UR50D or a folder with its files)")
    return source, esm.resolve_layers(layers, esm.Config.from_dict(config).num_hidden_layers)


class ProteinEmbedder:
    def __init__(self, model: str = DEFAULT_MODEL, *, device: str | None = None,
                 options: ProteinOptions = ProteinOptions()):
        self.source, self.layers = resolve_model_layers(model, options.layers)
        self.options = options
        self.cfg, self._weights = esm.load(self.source.path)
        self.tokenizer = EsmTokenizer.for_model(self.source.path)
        if len(self.layers) < len(options.layers):  # e.g. 6 and -1 of a 6-layer model: the output has fewer axes
            warnings.warn(f"layers {', '.join(map(str, options.layers))} name the same layer more than once; "
                          f"embedding layers {', '.join(map(str, self.layers))}", stacklevel=2)
        self.buckets = esm.length_buckets(options.max_len + 2)
        self._device = device
        self.choice = choose_device(device)  # strict devices fail here, before any work
        self.session: Session | None = None  # opened at the first batch: a finished --resume compiles nothing
        # one embedder may be shared by threads: the session is opened once, and runs take turns
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return self.cfg.hidden_size

    def report(self) -> dict:
        devices = self.session.report() if self.session else {"device_requested": self.choice.requested,
                                                              "device_effective": self.choice.effective}
        return {"model": self.source.name, "model_path": str(self.source.path), "pooling": self.options.pooling,
                "layers": list(self.layers), **devices}

    def embed(self, sequences: list[str] | str):
        """mean/cls pooling: float32 [n, hidden] ([n, n_layers, hidden] for several layers); a single string
        gives one row. per-residue: a list of [residues, hidden] (or [residues, n_layers, hidden]) arrays."""
        if isinstance(sequences, str):
            return self.embed([sequences])[0]
        by_index = {}
        for indices, vectors in self.embed_batches(sequences):  # which checks `sequences` first
            by_index.update(zip(indices, vectors))
        results = [by_index[i] for i in range(len(by_index))]
        if self.options.pooling == "per-residue":
            return results
        shape = (self.dim,) if len(self.layers) == 1 else (len(self.layers), self.dim)
        return np.stack(results) if results else np.zeros((0, *shape), np.float32)

    def embed_batches(self, sequences: list[str]) -> Iterator[tuple[tuple[int, ...], list[np.ndarray]]]:
        """Yields (indices into `sequences`, their embeddings) batch by batch, shortest sequences first."""
        if not isinstance(sequences, (list, tuple)):  # a str would be embedded letter by letter
            raise UsageError(f"embed() takes a list of protein sequences (strings), got {type(sequences).__name__}",
                             fix="pass a list of str, e.g. [r.sequence for r in read_fasta(path)]")
        tokens = []
        for i, s in enumerate(sequences):
            if not isinstance(s, str):
                raise UsageError(f"sequence {i} is a {type(s).__name__}, not a str",
                                 fix="pass protein sequences as str (decode bytes first)")
            try:
                ids = self.tokenizer.encode(s)
            except InputError as e:
                raise InputError(f"sequence {i}: {e.message}", fix=e.fix) from None
            if len(ids) == 2:
                raise InputError(f"sequence {i} is empty", fix="drop empty sequences before embedding")
            tokens.append(ids)
        long = [i for i, t in enumerate(tokens) if len(t) - 2 > self.options.max_len]
        if long and self.options.on_long == "error":
            raise InputError(f"{len(long)} sequence(s) longer than max_len {self.options.max_len} (first: sequence "
                             f"{long[0]}, {len(tokens[long[0]]) - 2} residues)",
                             fix="raise max_len, or truncate (on_long='truncate'), or drop them")
        if long:
            named = ", ".join(f"sequence {i} ({len(tokens[i]) - 2} residues)" for i in long[:10])
            warnings.warn(f"{len(long)} sequence(s) longer than {self.options.max_len} residues were truncated: "
                          f"{named}{', ...' if len(long) > 10 else ''}", stacklevel=2)
            for i in long:
                tokens[i] = np.concatenate([tokens[i][:self.options.max_len + 1], tokens[i][-1:]])
        plan = plan_batches([len(t) for t in tokens], self.buckets, self.options.toks_per_batch)
        if not plan:
            return
        for b in plan:
            with self._lock:  # per batch, not across the yield: other threads' batches interleave
                if self.session is None:
                    self.session = Session(program_graphs(self.cfg, self.options), self._weights, device=self._device)
                    self._weights = None  # the session holds its own copy
                vectors = self._run(b, [tokens[i] for i in b.indices])
            yield b.indices, vectors

    def _run(self, batch: Batch, tokens: list[np.ndarray]) -> list[np.ndarray]:
        ids = np.full((batch.batch, batch.length), self.tokenizer.pad, np.int32)
        mask = np.zeros((batch.batch, batch.length), np.float32)
        ids[:, :2] = self.tokenizer.cls, self.tokenizer.eos  # filler rows: an empty protein, never returned
        mask[:, :2] = 1.0
        for row, t in enumerate(tokens):
            ids[row, :len(t)] = t
            mask[row, :len(t)] = 1.0
        out = self.session.run(esm.entry(batch.batch, batch.length), ids=ids, mask=mask)
        hidden = np.stack([out[f"layer_{k}"] for k in self.layers], axis=2)  # [B, T, n_layers, H]
        if len(self.layers) == 1:
            hidden = hidden[:, :, 0]
        if not np.all(np.isfinite(hidden[:len(tokens)])):
            raise InputError("the model produced non-finite values", fix="check the checkpoint; report the input")
        results = []
        for row, t in enumerate(tokens):
            residues = hidden[row, 1:len(t) - 1]
            if self.options.pooling == "mean":
                results.append(residues.mean(axis=0))
            elif self.options.pooling == "cls":
                results.append(hidden[row, 0].copy())
            else:
                results.append(residues.copy())
        return results

    def close(self):
        if self.session is not None:
            self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
