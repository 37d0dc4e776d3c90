"""Fuzz harness for every checked reader: seeded mutations of real inputs (truncation, byte flips, inserted
bytes, huge declared sizes, JSON edits). Each input must give the reader's typed error (an SdkError) or a
result that passes the reader's sanity check; any other exception is a failure, saved for reproduction.

    python -m tests.fuzz_readers                 # the CI budget (tests/test_fuzz_readers.py runs this)
    python -m tests.fuzz_readers --long          # 50x the inputs, for a person with time
    python -m tests.fuzz_readers --reader image --inputs 5000 --seed 7 --save /tmp/fuzz-failures

Each reader runs in its own process under an address-space limit (RLIMIT_AS), so an allocation sized by a
malformed header fails as MemoryError (an unexpected exception) instead of taking the machine down, and
the peak RSS per reader is measured. Prints one line per reader: inputs tried, unexpected exceptions, peak RSS.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
ADDRESS_SPACE_LIMIT = 2 << 30   # far above what the readers need, far below RAM: a header-sized allocation fails
HUGE = [0, 1, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 40, (1 << 63) - 1, (1 << 64) - 1]


# ---- mutations ---------------------------------------------------------------------------------------------

def mutate(data: bytes, rng: random.Random) -> bytes:
    """One of: truncate, flip bytes, insert bytes, write a huge little-endian integer, duplicate a slice,
    empty; sometimes two in a row."""
    kind = rng.randrange(7)
    n = len(data)
    if kind == 0 or n == 0:
        out = data[:rng.randrange(n + 1)] if n else b""
    elif kind == 1:
        out = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(n)] ^= 1 << rng.randrange(8)
        out = bytes(out)
    elif kind == 2:
        at = rng.randrange(n + 1)
        out = data[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16))) + data[at:]
    elif kind in (3, 4):  # a size field, anywhere: the headers all start with them
        width = rng.choice([2, 4, 8])
        at = rng.randrange(max(1, min(n, 4096) - width)) if kind == 3 else rng.randrange(max(1, n - width))
        value = rng.choice(HUGE) & ((1 << (8 * width)) - 1)
        out = data[:at] + value.to_bytes(width, "little") + data[at + width:]
    elif kind == 5:
        a, b = sorted(rng.randrange(n + 1) for _ in range(2))
        out = data[:b] + data[a:b] * rng.randint(1, 4) + data[b:]
    else:
        out = b""
    return mutate(out, rng) if rng.random() < 0.2 and out else out


def mutate_json(doc, rng: random.Random):
    """A JSON document with one value replaced (by a huge, negative, zero, wrong-typed or missing value)."""
    doc = json.loads(json.dumps(doc))
    paths = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                paths.append(path + [k])
                walk(v, path + [k])
        elif isinstance(node, list) and node:
            for i in rng.sample(range(len(node)), min(len(node), 4)):
                paths.append(path + [i])
                walk(node[i], path + [i])
    walk(doc, [])
    if not paths:
        return rng.choice([[], None, 0, "x"])
    *parent_path, key = rng.choice(paths)
    parent = doc
    for p in parent_path:
        parent = parent[p]
    replacement = rng.choice([10 ** 9, -1, 0, 2 ** 63, 1.5, "12", None, [], {}, [1, 2], True, "x"])
    if rng.random() < 0.2 and isinstance(parent, dict):
        del parent[key]
    else:
        parent[key] = replacement
    return doc


# ---- the readers: (seed files, how to run one input, sanity check of a result) ----------------------------

class Case:
    def __init__(self, name: str, seeds: Callable[[Path], list[bytes]], run: Callable[[Path, bytes], object],
                 json_seeds: bool = False):
        self.name, self.seeds, self.run, self.json_seeds = name, seeds, run, json_seeds


def _safetensors_seeds(work: Path) -> list[bytes]:
    return [(FIXTURES / "bert" / "model.safetensors").read_bytes()]


def _run_safetensors(work: Path, data: bytes):
    from sdk.weights import read_safetensors
    path = work / "model.safetensors"
    path.write_bytes(data)
    tensors = read_safetensors(path)
    assert sum(t.nbytes for t in tensors.values()) <= 2 * len(data), "more tensor bytes than the file holds"


def _shard_folder(work: Path) -> Path:
    from safetensors.numpy import save_file

    from sdk.weights import read_safetensors
    folder = work / "sharded"
    if not folder.exists():
        folder.mkdir()
        tensors = read_safetensors(FIXTURES / "bert" / "model.safetensors")
        names = sorted(tensors)
        for i, keys in enumerate((names[::2], names[1::2])):
            save_file({k: np.array(tensors[k]) for k in keys}, str(folder / f"model-0000{i + 1}-of-00002.safetensors"))
        (work / "outside.safetensors").write_bytes((folder / "model-00001-of-00002.safetensors").read_bytes())
    return folder


def _index_seeds(work: Path) -> list[bytes]:
    _shard_folder(work)
    from sdk.weights import read_safetensors
    names = sorted(read_safetensors(FIXTURES / "bert" / "model.safetensors"))
    weight_map = {k: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, k in enumerate(names)}
    return [json.dumps({"metadata": {}, "weight_map": weight_map}).encode()]


def _run_index(work: Path, data: bytes):
    from sdk.weights import read_safetensors_shards
    folder = _shard_folder(work)
    (folder / "model.safetensors.index.json").write_bytes(data)
    tensors = read_safetensors_shards(folder)
    assert all(Path(k).name == k for k in tensors) or tensors


def _config_seeds(work: Path) -> list[bytes]:
    return [(FIXTURES / "bert" / "config.json").read_bytes()]


def _run_config(work: Path, data: bytes):
    from sdk.models import bert
    folder = work / "bert"
    if not folder.exists():
        shutil.copytree(FIXTURES / "bert", folder)
    (folder / "config.json").write_bytes(data)
    cfg, weights = bert.load(folder)  # a config that still loads must match the weights present
    assert weights and cfg.num_hidden_layers <= 1024


def _tokenizer_seeds(work: Path) -> list[bytes]:
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {w: i for i, w in enumerate(["[UNK]", "[CLS]", "[SEP]", "a", "man", "is", "eating", "food", "##s", "."])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return [tok.to_str().encode()]


def _run_tokenizer(work: Path, data: bytes):
    from sdk.vocab import read_tokenizer
    path = work / "tokenizer.json"
    path.write_bytes(data)
    read_tokenizer(path, encodes_any_text=True).encode("a man is eating foods.")


def _vocabulary_seeds(work: Path) -> list[bytes]:
    return ["\n".join(["<|endoftext|>", "a", "b", "<|0.00|>", "<|0.02|>", "é"]).encode() + b"\n",
            (FIXTURES / "esm" / "vocab.txt").read_bytes()]


def _run_vocabulary(work: Path, data: bytes):
    from sdk.vocab import read_vocabulary
    path = work / "vocabulary.txt"
    path.write_bytes(data)
    tokens = read_vocabulary(path)
    assert len(tokens) <= data.count(b"\n") + 1


def _ct2_seeds(work: Path) -> list[bytes]:
    return [(FIXTURES / "whisper" / "ct2" / "model.bin").read_bytes()]


def _run_ct2(work: Path, data: bytes):
    from sdk.models import whisper
    folder = work / "ct2"
    if not folder.exists():
        shutil.copytree(FIXTURES / "whisper" / "ct2", folder)
    (folder / "model.bin").write_bytes(data)
    cfg, weights = whisper.load(folder)
    assert weights and cfg.encoder_layers <= 1024


def _audio_seeds(work: Path) -> list[bytes]:
    import soundfile as sf
    t = np.arange(16000) / 16000
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    out = []
    for fmt, subtype, rate, channels in (("WAV", "PCM_16", 16000, 1), ("WAV", "FLOAT", 48000, 2),
                                         ("FLAC", "PCM_16", 22050, 1), ("OGG", "VORBIS", 16000, 1)):
        buffer = io.BytesIO()
        samples = np.resize(tone, rate) if channels == 1 else np.stack([np.resize(tone, rate)] * 2, axis=1)
        sf.write(buffer, samples, rate, format=fmt, subtype=subtype)
        out.append(buffer.getvalue())
    return out


def _run_audio(work: Path, data: bytes):
    from pipelines.audio import stream_audio
    suffix = {b"RIFF": ".wav", b"fLaC": ".flac", b"OggS": ".ogg"}.get(data[:4], ".wav")
    path = work / f"clip{suffix}"
    path.write_bytes(data)
    samples = np.concatenate(list(stream_audio(path)))
    assert samples.dtype == np.float32 and np.isfinite(samples).all()


def _image_seeds(work: Path) -> list[bytes]:
    import cv2
    image = np.random.default_rng(0).integers(0, 255, (24, 32, 3), np.uint8)
    return [cv2.imencode(ext, image)[1].tobytes() for ext in (".png", ".jpg", ".bmp", ".webp", ".ppm")]


def _run_image(work: Path, data: bytes):
    from pipelines.vision import read_image
    path = work / "image"
    path.write_bytes(data)
    image = read_image(path)
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3


FASTA = (">sp|P69905|HBA_HUMAN Hemoglobin subunit alpha\nMVLSPADKTNVKAAWGKVGAHAGEYGAEALERMFLSFPTTKTYFPHF\n"
         "DLSHGSAQVKGHGKKVADALTNAVAHVDDMPNALSALSDLHAHKLRVDPVNFKLLSHCLLVTLAAHLPAEFTPAVHASLDKFLASVSTVLTSKYR\n"
         ";a comment\n>second record\r\nmvhltpeeks avtalwgkvn*\n\n>empty\n")


def _run_fasta(work: Path, data: bytes):
    from pipelines.protein import read_fasta
    path = work / "in.fasta"
    path.write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records = read_fasta(path)
    assert all(r.sequence.isupper() or not r.sequence.strip("-.") for r in records)


def _run_lines(work: Path, data: bytes):
    from pipelines.text import read_lines
    lines = read_lines(io.BytesIO(data), "input")
    assert len(lines) == data.count(b"\n") + (not data.endswith(b"\n"))


CASES = {c.name: c for c in [
    Case("safetensors", _safetensors_seeds, _run_safetensors),
    Case("shard-index", _index_seeds, _run_index, json_seeds=True),
    Case("config", _config_seeds, _run_config, json_seeds=True),
    Case("tokenizer", _tokenizer_seeds, _run_tokenizer, json_seeds=True),
    Case("vocabulary", _vocabulary_seeds, _run_vocabulary),
    Case("ctranslate2", _ct2_seeds, _run_ct2),
    Case("audio", _audio_seeds, _run_audio),
    Case("image", _image_seeds, _run_image),
    Case("fasta", lambda work: [FASTA.encode()], _run_fasta),
    Case("text-lines", lambda work: ["one\ntwo\u2028half\r\nthree\n".encode(), b"x"], _run_lines),
]}
CI_INPUTS = {"safetensors": 150, "shard-index": 60, "config": 60, "tokenizer": 100, "vocabulary": 150,
             "ctranslate2": 60, "audio": 80, "image": 150, "fasta": 150, "text-lines": 150}


# ---- running --------------------------------------------------------------------------------------------

def fuzz_one(name: str, inputs: int, seed: int, save: Path | None) -> dict:
    """Run one reader over `inputs` mutated inputs in this process; the summary as a dict."""
    from sdk.errors import SdkError
    case, save = CASES[name], Path(save) if save else None
    rng = random.Random(f"{seed}/{name}")
    unexpected, typed, results = [], 0, 0
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{name}-") as tmp:
        work = Path(tmp)
        seeds = case.seeds(work)
        for k in range(inputs):
            base = seeds[k % len(seeds)]
            if k < len(seeds):
                data = base  # the real input itself must read
            elif case.json_seeds and rng.random() < 0.5:
                try:
                    data = json.dumps(mutate_json(json.loads(base), rng)).encode()
                except (ValueError, RecursionError):
                    data = mutate(base, rng)
            else:
                data = mutate(base, rng)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    case.run(work, data)
                results += 1
            except SdkError:
                typed += 1
                if k < len(seeds):
                    unexpected.append({"input": k, "error": "the unmutated seed was refused"})
            except BaseException as e:  # noqa: BLE001 - anything else is what the harness looks for
                if isinstance(e, KeyboardInterrupt):
                    raise
                where = traceback.extract_tb(e.__traceback__)[-1]
                unexpected.append({"input": k, "error": f"{type(e).__name__}: {str(e)[:200]}",
                                   "at": f"{Path(where.filename).name}:{where.lineno}"})
                if save is not None:
                    save.mkdir(parents=True, exist_ok=True)
                    (save / f"{name}-{seed}-{k}.bin").write_bytes(data)
    return {"reader": name, "inputs": inputs, "typed_errors": typed, "results": results,
            "unexpected": unexpected, "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> int:
    """This process's peak RSS (VmHWM: ru_maxrss would include the parent's size from before exec)."""
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) // 1024


def fuzz(readers: list[str], scale: float = 1.0, inputs: int | None = None, seed: int = 0,
         save: Path | None = None) -> list[dict]:
    """Each reader in its own subprocess, under ADDRESS_SPACE_LIMIT; their summaries."""
    out = []
    for name in readers:
        count = inputs or max(1, int(CI_INPUTS[name] * scale))
        code = (f"import json, resource; resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE_LIMIT}, "
                f"{ADDRESS_SPACE_LIMIT}))\nfrom tests.fuzz_readers import fuzz_one\n"
                f"print(json.dumps(fuzz_one({name!r}, {count}, {seed}, {str(save) if save else None!r})))")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
        if r.returncode != 0 or not r.stdout.strip():
            out.append({"reader": name, "inputs": count, "typed_errors": 0, "results": 0, "peak_rss_mb": -1,
                        "unexpected": [{"input": -1, "error": f"the fuzz process died (exit {r.returncode}): "
                                                              f"{r.stderr[-1500:]}"}]})
        else:
            out.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return out


def table(summaries: list[dict]) -> str:
    lines = [f"{'reader':<12} {'inputs':>7} {'typed':>6} {'read':>6} {'unexpected':>10} {'peak RSS':>9}"]
    for s in summaries:
        lines.append(f"{s['reader']:<12} {s['inputs']:>7} {s['typed_errors']:>6} {s['results']:>6} "
                     f"{len(s['unexpected']):>10} {s['peak_rss_mb']:>6} MB")
        lines += [f"    {u}" for u in s["unexpected"][:5]]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--long", action="store_true", help="50x the CI budget")
    parser.add_argument("--reader", action="append", choices=sorted(CASES), help="only these readers")
    parser.add_argument("--inputs", type=int, help="inputs per reader (overrides the budget)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", type=Path, help="write inputs that raised unexpected exceptions here")
    parser.add_argument("--json", action="store_true", help="the summaries as JSON on stdout")
    args = parser.parse_args(argv)
    summaries = fuzz(args.reader or list(CASES), 50.0 if args.long else 1.0, args.inputs, args.seed, args.save)
    print(json.dumps(summaries, indent=1) if args.json else table(summaries))
    return 1 if any(s["unexpected"] for s in summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
