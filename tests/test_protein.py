"""Protein pipeline and `aie-apps embed`: ESM tokenizer vs transformers' EsmTokenizer, FASTA edge cases,
bucketing and token-budget batching, pooling against the transformers goldens, padding invariance, and the
CLI end to end on EMBOSS globins.fasta with a tiny random-init ESM-2 (including an interrupted run resumed)."""
from __future__ import annotations

import io
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from apps.main import app
from pipelines.protein import (EsmTokenizer, ProteinEmbedder, ProteinOptions, check_unique_ids, plan_batches,
                               program_graphs, read_fasta)
from sdk.errors import InputError, ModelNotFound, UsageError
from sdk.models import esm
from sdk.session import Session

from .conftest import FIXTURES

MODEL = FIXTURES / "esm"
GLOBINS = Path("/usr/share/EMBOSS/test/data/globins.fasta")
runner = CliRunner()


@pytest.fixture(scope="module")
def golden():
    return np.load(MODEL / "golden.npz")


@pytest.fixture(scope="module")
def embedder():
    with ProteinEmbedder(str(MODEL), device="cpu") as e:
        yield e


# ---- tokenizer -----------------------------------------------------------------------------------

def test_tokenizer_matches_transformers_esm_tokenizer(golden):
    tok = EsmTokenizer.for_model(MODEL)  # also checks the fixture's vocab.txt is our alphabet
    for text, ref in zip(golden["tokenizer_cases"], golden["tokenizer_ids"]):
        assert tok.encode(str(text)).tolist() == ref[ref >= 0].tolist(), text
    assert tok.encode("mqifvktltg").tolist() == tok.encode("MQIFVKTLTG").tolist()  # lower case accepted
    assert tok.encode("MJK").tolist() == [0, 20, 3, 15, 2]  # J is not a residue the alphabet knows: <unk>


@pytest.mark.parametrize("bad,position", [("MK1L", 3), ("MK L", 3), ("MKÄL", 3), ("MK*", 3), ("<foo>A", 1), ("M<mask>K1", 4)])
def test_tokenizer_rejects_non_residues_with_position(bad, position):
    with pytest.raises(InputError, match=f"at residue {position} "):
        EsmTokenizer().encode(bad)


# ---- FASTA ---------------------------------------------------------------------------------------

def test_fasta_tolerates_blank_lines_crlf_lower_case_comments_and_terminators(tmp_path):
    path = tmp_path / "messy.fasta"
    path.write_bytes(b"\xef\xbb\xbf>sp|P1|ONE first protein\r\n\r\nmkta yiak\r\nQRQ*\r\n"
                     b";a comment line\n>two\n\nAC\nDE*\n\n>three\n>four\n  gs-hm.\n")
    records = read_fasta(path)
    assert [(r.id, r.sequence, r.line) for r in records] == [
        ("sp_P1_ONE", "MKTAYIAKQRQ", 1), ("two", "ACDE", 6), ("three", "", 11), ("four", "GS-HM.", 12)]
    assert records[0].header == "sp|P1|ONE first protein"


@pytest.mark.parametrize("text,message", [
    (">a\nMKT\n>b desc\nMK\nAX9L\n", r"record 'b' \(header on line 3\): invalid character '9' at residue 5 \(line 5\)"),
    (">a\nMK*T\n", r"record 'a'.*invalid character '\*' at residue 3"),
    (">a\nMK*\nTL\n", r"residues after the '\*' terminator on line 3"),
    ("MKT\n>a\nMK\n", r"line 1: sequence data before the first '>' header"),
    (">a\nMK_T\n", r"invalid character '_' at residue 3"),
])
def test_fasta_errors_name_record_and_position(text, message):
    with pytest.raises(InputError, match=message):
        read_fasta(io.StringIO(text))


@pytest.mark.parametrize("source", [None, io.BytesIO(b">a\nMKT\n")])
def test_fasta_source_that_is_not_text_is_a_usage_error(source):
    with pytest.raises(UsageError, match="read_fasta takes a path or a text stream") as e:
        read_fasta(source)
    assert "text mode" in e.value.fix


def test_fasta_very_long_record_and_binary_input(tmp_path):
    line = "ACDEFGHIKLMNPQRSTVWY" * 3 + "\n"
    path = tmp_path / "long.fasta"
    path.write_text(">titin-like\n" + line * 20000)  # 1.2 M residues on 20k lines
    (record,) = read_fasta(path)
    assert len(record.sequence) == 1_200_000 and record.sequence.endswith("VWY")
    path.write_bytes(b">x\n\xff\xfeMKT\n")
    with pytest.raises(InputError, match="not UTF-8"):
        read_fasta(path)
    with pytest.raises(InputError, match="cannot read"):
        read_fasta(tmp_path / "missing.fasta")


# a gene (lower case, N, wrapped), an mRNA and a protein: ESM-2 would embed the first two as nonsense proteins
NUCLEOTIDES = (">gene1 some CDS\nATGGCCAAGCTGACCGGTAACGTTAGCAAG\nacgtacgtnnacgtacgt\n"
               ">mrna1\nAUGGCUAACGUUAGCAUGGCUAACGUU\n>prot\nMKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ\n")


def test_nucleotide_records_are_read_with_a_warning_naming_them(tmp_path):
    path = tmp_path / "genes.fasta"
    path.write_text(NUCLEOTIDES)
    with pytest.warns(UserWarning, match=r"^2 of 3 records look like nucleotide \(DNA/RNA\) sequences, not protein: "
                                         r"gene1, mrna1; ESM-2 expects amino-acid .*`seqkit translate`$"):
        records = read_fasta(path)
    assert [r.id for r in records] == ["gene1", "mrna1", "prot"]  # still read: the caller decides
    many = "".join(f">dna{i}\n{'ACGTTGCA' * 3}\n" for i in range(7))
    with pytest.warns(UserWarning, match=r"7 of 7 records .*: dna0, dna1, dna2, dna3, dna4, \.\.\.; "):
        read_fasta(io.StringIO(many))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # proteins; a short peptide of these letters; a Gly-Ser linker (80%); a gapped alignment of 16 letters
        read_fasta(io.StringIO(">p\nMKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ\n>pep\nACGTACGTNACGTACGTAC\n"
                               ">linker\nGGGGSGGGGSGGGGSGGGGS\n>aln\nACGT----ACGT....ACGTACGT\n"))


def test_ids_are_sanitised_and_duplicates_refused_up_front():
    records = read_fasta(io.StringIO(">../etc/passwd x\nMK\n>a/b\nMK\n>a_b\nMK\n>c\nM\n>c\nK\n>\nMK\n"))
    assert [r.id for r in records] == ["_._etc_passwd", "a_b", "a_b", "c", "c", "record_line11"]
    with pytest.raises(InputError, match=r"2 duplicate sequence ID\(s\): a_b \(lines 3, 5\); c \(lines 7, 9\)"):
        check_unique_ids(records)


# ---- static shapes and batching ------------------------------------------------------------------

def test_buckets_and_token_budget_batches():
    assert esm.length_buckets(1024) == (64, 128, 256, 512, 1024)
    assert esm.length_buckets(102) == (64, 102)
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 1025, 300).tolist()
    buckets = esm.length_buckets(1024)
    plan = plan_batches(lengths, buckets, 4096)
    seen = sorted(i for b in plan for i in b.indices)
    assert seen == list(range(300))  # every sequence exactly once
    for b in plan:
        assert b.length in buckets and all(lengths[i] <= b.length for i in b.indices)
        assert b.batch in esm.batch_sizes(b.length, 4096) and len(b.indices) <= b.batch
        assert b.batch == 1 or 2 * len(b.indices) >= b.batch  # filler rows never double a batch's work
    # a sequence over the whole budget still gets a batch of its own
    assert plan_batches([1024], buckets, 100)[0].batch == 1
    # 5 sequences in the 64 bucket (16 rows a batch at 1024 tokens): one at a time; 10: one padded batch
    assert [b.batch for b in plan_batches([10] * 5, buckets, 1024)] == [1] * 5
    assert [b.batch for b in plan_batches([10] * 10, buckets, 1024)] == [16]


def test_a_raised_max_len_keeps_bucketing_long_proteins():
    """--max-len 20000 for a 5000-residue protein: an 8192-token shape, not 20002 (6x the attention work)."""
    buckets = esm.length_buckets(20002)
    assert buckets[5:] == (2048, 4096, 8192, 16384, 20002)
    assert [b.length for b in plan_batches([5002, 1102], buckets, 4096)] == [2048, 8192]


def test_the_session_holds_every_planned_shape_up_front():
    """The embedder's one session is esm.program_graphs for its options (what `aie-apps build` compiles): every
    batch a plan can make is one of its entries, so no input shape compiles anything new."""
    options = ProteinOptions(toks_per_batch=256, max_len=126)
    names = [g.name for g in program_graphs(esm.TINY, options)]
    assert names == ["esm_b1_t64", "esm_b4_t64", "esm_b1_t128", "esm_b2_t128"]
    with ProteinEmbedder(str(MODEL), device="cpu", options=options) as e:
        e.embed(["MKTAYIAKQR"] * 3 + ["G" * 100])
        assert list(e.session.program.entries) == names


# ---- embeddings ----------------------------------------------------------------------------------

def test_mean_cls_and_per_residue_match_transformers_goldens(golden, embedder, record_parity):
    sequences = [str(s) for s in golden["sequences"]]
    last = golden["hidden"][-1]
    n = golden["mask"].sum(1).astype(int) - 2  # residues per sequence
    mean = embedder.embed(sequences)
    ref_mean = np.stack([last[b, 1:n[b] + 1].mean(0) for b in range(len(sequences))])
    assert record_parity("esm.pool.mean", mean, ref_mean)[0] <= 1e-4
    with ProteinEmbedder(str(MODEL), device="cpu", options=ProteinOptions(pooling="cls", layers=(0, -1))) as e:
        cls = e.embed(sequences)
    assert cls.shape == (4, 2, esm.TINY.hidden_size)
    ref_cls = np.stack([golden["hidden"][[0, -1], b, 0] for b in range(4)])
    assert record_parity("esm.pool.cls", cls, ref_cls)[0] <= 1e-4
    with ProteinEmbedder(str(MODEL), device="cpu", options=ProteinOptions(pooling="per-residue", layers=(-2,))) as e:
        per = e.embed(sequences)
    assert [p.shape[0] for p in per] == n.tolist()
    assert record_parity("esm.pool.per-residue", np.concatenate(per),
                         np.concatenate([golden["hidden"][-2][b, 1:n[b] + 1] for b in range(4)]))[0] <= 1e-4


def test_padding_never_changes_an_embedding(embedder):
    rng = np.random.default_rng(3)
    letters = np.array(list("ACDEFGHIKLMNPQRSTVWY"))
    short = "".join(rng.choice(letters, 12))
    others = ["".join(rng.choice(letters, n)) for n in (25, 170, 28, 9)]
    alone = embedder.embed(short)  # bucket 32, batch 1
    together = embedder.embed([others[0], short, *others[1:]])  # bucket 32, batch of 4 with others
    np.testing.assert_allclose(together[1], alone, atol=1e-5, rtol=0)
    # heavy padding: the same protein at a 192-token static shape, next to a long one
    ids = np.full((2, 192), 1, np.int32)
    mask = np.zeros((2, 192), np.float32)
    for row, seq in enumerate((short, others[2])):
        t = embedder.tokenizer.encode(seq)
        ids[row, :len(t)], mask[row, :len(t)] = t, 1
    with Session([esm.graph(embedder.cfg, 2, 192)], esm.load(embedder.source.path)[1], device="cpu") as s:
        hidden = s.run(ids=ids, mask=mask)[f"layer_{embedder.cfg.num_hidden_layers}"]
    np.testing.assert_allclose(hidden[0, 1:13].mean(0), alone, atol=1e-5, rtol=0)


def test_long_and_empty_sequences(embedder):
    opts = ProteinOptions(max_len=20)
    with ProteinEmbedder(str(MODEL), device="cpu", options=opts) as e:
        with pytest.warns(UserWarning, match=r"2 sequence.*truncated: sequence 0 \(50 residues\), sequence 2 \(21 "):
            v = e.embed(["M" * 50, "MKT", "M" * 21])
        np.testing.assert_allclose(v[0], e.embed("M" * 20), atol=1e-5)
    with ProteinEmbedder(str(MODEL), device="cpu", options=ProteinOptions(max_len=20, on_long="error")) as e:
        with pytest.raises(InputError, match="longer than max_len 20"):
            e.embed(["M" * 21])
    with pytest.raises(InputError, match="sequence 1 is empty"):
        embedder.embed(["MK", ""])
    with pytest.raises(InputError, match="sequence 0: invalid character '1'"):
        embedder.embed(["M1"])
    with pytest.raises(UsageError, match="layer 9 does not exist"):
        ProteinEmbedder(str(MODEL), device="cpu", options=ProteinOptions(layers=(9,)))
    with pytest.raises(UsageError, match="unknown pooling"):
        ProteinOptions(pooling="max")


def test_layers_naming_the_same_layer_twice_are_embedded_once_with_a_warning():
    # the tiny model has 3 layers, so 3 and -1 are one layer: the output has 2 layer axes, not the 3 asked for
    with pytest.warns(UserWarning, match="layers 0, 3, -1 name the same layer more than once; embedding layers 0, 3"):
        e = ProteinEmbedder(str(MODEL), device="cpu", options=ProteinOptions(layers=(0, 3, -1)))
    with e:
        assert e.layers == (0, 3) and e.embed(["MKT"]).shape == (1, 2, esm.TINY.hidden_size)
    r = _embed("-", "--layers", "0,3,-1", input=">a\nMK\n")
    assert r.exit_code == 0 and "name the same layer more than once" in r.stderr


def test_what_is_not_a_list_of_sequences_is_a_usage_error(embedder):
    for bad, message in [(None, "got NoneType"), ((s for s in ["MKT"]), "got generator"),
                         (["MKT", None], "sequence 1 is a NoneType")]:
        with pytest.raises(UsageError, match=message):
            embedder.embed(bad)
    # embed_batches would have embedded a string letter by letter, and a generator as nothing at all
    for bad in ("MKT", (s for s in ["MKT", "GSH"])):
        with pytest.raises(UsageError, match="takes a list of protein sequences"):
            list(embedder.embed_batches(bad))
    with pytest.raises(UsageError, match="layers must be a tuple"):
        ProteinOptions(layers=-1)
    assert ProteinOptions(layers=(np.int64(-1), 0)).layers == (-1, 0)  # numpy integers are layer numbers too


def test_the_sdk_facade_exports_the_embedder():
    import sdk
    assert sdk.ProteinEmbedder is ProteinEmbedder


@pytest.mark.parametrize("name", ["esm2_t6_8M_UR50D", "facebook/esm2_t6_8M_UR50D"])
def test_missing_real_weights_are_a_typed_error_with_the_fix(name):
    with pytest.raises(ModelNotFound) as info:
        ProteinEmbedder(name, device="cpu")
    assert "facebook/esm2_t6_8M_UR50D" in str(info.value) and "huggingface-cli download" in info.value.fix
    assert info.value.exit_code == 4


# ---- the CLI -------------------------------------------------------------------------------------

def _embed(*args, input=None):
    return runner.invoke(app, ["embed", *map(str, args), "--model", str(MODEL), "--device", "cpu"], input=input)


needs_globins = pytest.mark.skipif(not GLOBINS.exists(), reason="needs Debian emboss-test (globins.fasta)")


@needs_globins
def test_cli_globins_to_npz_in_input_order(tmp_path, embedder):
    out = tmp_path / "globins.npz"
    r = _embed(GLOBINS, "-o", out, "--toks-per-batch", "512")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "" and "embedded 7 sequences (1029 residues)" in r.stderr and "on cpu" in r.stderr
    assert "embedding:" not in r.stderr  # no progress line when stderr is not a terminal
    records = read_fasta(GLOBINS)
    with np.load(out) as d:  # plain arrays: loads without pickle
        assert d["ids"].tolist() == [r.id for r in records] == ["HBB_HUMAN", "HBB_HORSE", "HBA_HUMAN", "HBA_HORSE",
                                                                "MYG_PHYCA", "GLB5_PETMA", "LGB2_LUPLU"]
        assert d["embeddings"].shape == (7, esm.TINY.hidden_size) and d["layers"].tolist() == [3]
        assert d["lengths"].tolist() == [len(r.sequence) for r in records]
        np.testing.assert_allclose(d["embeddings"], embedder.embed([r.sequence for r in records]), atol=1e-6)
    assert not (tmp_path / "globins.npz.parts").exists()


@needs_globins
def test_cli_resumes_after_an_interruption(tmp_path, monkeypatch):
    out = tmp_path / "g.npz"
    complete = tmp_path / "complete.npz"
    assert _embed(GLOBINS, "-o", complete, "--toks-per-batch", "300").exit_code == 0
    real = ProteinEmbedder.embed_batches
    embedded = []

    def interrupted_after_two_batches(self, sequences):
        for n, batch in enumerate(real(self, sequences)):
            if n == 2:
                raise KeyboardInterrupt
            yield batch

    monkeypatch.setattr(ProteinEmbedder, "embed_batches", interrupted_after_two_batches)
    r = _embed(GLOBINS, "-o", out, "--toks-per-batch", "300")
    assert r.exit_code == 130 and "--resume" in r.stderr and not out.exists()
    assert len(list((tmp_path / "g.npz.parts").glob("part-*.npz"))) == 2

    r = _embed(GLOBINS, "-o", out, "--toks-per-batch", "300")  # forgetting --resume does not clobber the parts
    assert r.exit_code == 2 and "--resume" in r.stderr
    r = _embed(GLOBINS, "-o", out, "--toks-per-batch", "300", "--pooling", "cls", "--resume")
    assert r.exit_code == 2 and "different settings" in r.stderr and "pooling" in r.stderr

    def counting(self, sequences):
        embedded.extend(sequences)
        yield from real(self, sequences)

    monkeypatch.setattr(ProteinEmbedder, "embed_batches", counting)
    r = _embed(GLOBINS, "-o", out, "--toks-per-batch", "300", "--resume")
    assert r.exit_code == 0, r.stderr
    assert "resuming: 2 of 7 sequences already embedded" in r.stderr and len(embedded) == 5
    with np.load(out) as a, np.load(complete) as b:
        assert a["ids"].tolist() == b["ids"].tolist()
        np.testing.assert_allclose(a["embeddings"], b["embeddings"], atol=1e-6)
    assert not (tmp_path / "g.npz.parts").exists()


@needs_globins
def test_cli_ctrl_c_in_a_real_process_then_resume(tmp_path):
    """SIGINT to a running `aie-apps embed`: exit 130, no output file, whole parts only; --resume finishes and
    gives exactly what an uninterrupted run gives."""
    import os
    import signal
    import subprocess
    import time
    records = read_fasta(GLOBINS)
    fasta = tmp_path / "many.fasta"
    fasta.write_text("".join(f">{r.id}_{n} copy {n}\n{r.sequence[n % 40:]}\n" for n in range(20) for r in records))
    out = tmp_path / "many.npz"
    cmd = [sys.executable, "-m", "apps.main", "embed", str(fasta), "-o", str(out), "--model", str(MODEL),
           "--device", "cpu", "--toks-per-batch", "200"]  # one sequence per batch: 140 batches
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    # SIGINT as at a terminal: a runner started in the background by a non-interactive shell (`... &`) ignores
    # SIGINT, and a child inherits that, so the signal would do nothing
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    parts = tmp_path / "many.npz.parts"
    deadline = time.time() + 60
    while len(list(parts.glob("part-*.npz"))) < 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "--resume" in stderr and not out.exists()
    saved = len(list(parts.glob("part-*.npz")))
    assert 3 <= saved < 140
    r = subprocess.run(cmd + ["--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"resuming: {saved} of 140 sequences already embedded" in r.stderr
    with np.load(out) as d, ProteinEmbedder(str(MODEL), device="cpu") as e:
        assert d["ids"].tolist() == [f"{r.id}_{n}" for n in range(20) for r in records]
        np.testing.assert_allclose(d["embeddings"], e.embed([r.sequence[n % 40:] for n in range(20) for r in records]),
                                   atol=1e-5, rtol=0)


def test_cli_stdin_jsonl_per_residue_and_policies(tmp_path):
    fasta = ">ok first\nMKTAYIAKQR\n>empty\n\n>long\n" + "ACDEFGHIKL" * 5 + "\n>tail\nmkt*\n"
    r = _embed("-", "--pooling", "per-residue", "--layers", "0,-1", "--max-len", "30", input=fasta)
    assert r.exit_code == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["id"] for x in lines] == ["ok", "long", "tail"] and [x["length"] for x in lines] == [10, 30, 3]
    assert np.array(lines[0]["embedding"]).shape == (10, 2, esm.TINY.hidden_size) and lines[0]["layers"] == [0, 3]
    assert "skipping empty" in r.stderr and "truncating long from 50 to 30" in r.stderr
    r = _embed("-", "--max-len", "30", "--on-long", "skip", "-o", tmp_path / "x.jsonl", input=fasta)
    assert r.exit_code == 0 and "skipping long" in r.stderr
    assert [json.loads(x)["id"] for x in (tmp_path / "x.jsonl").read_text().splitlines()] == ["ok", "tail"]
    r = _embed("-", "--max-len", "30", "--on-long", "error", input=fasta)
    assert r.exit_code == 1 and "long (line 5) has 50 residues" in r.stderr


def test_emulated_npu_one_dispatch_per_batch_and_close_to_cpu(tmp_path, embedder, record_parity):
    """Emulated (no NPU here): the same pipeline on the functional NPU emulator, bf16 numerics: each vector
    within the emulator's rel-L2 budget (1e-2) of the cpu's."""
    sequences = ["MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "GSHMLEDPVDAFQA", "MQIFVKTLTGKTITLE"]
    with ProteinEmbedder(str(MODEL), device="emu", options=ProteinOptions(toks_per_batch=128)) as e:
        vectors = e.embed(sequences)
        assert e.session.counters.dispatches == e.session.counters.runs == 2  # one dispatch per batch
        assert e.report()["npu_fraction"]["ops"] == 1.0
    for i, (ours, ref) in enumerate(zip(vectors, embedder.embed(sequences))):
        assert record_parity(f"esm.tiny.emu.vector{i}", ours, ref)[1] <= 1e-2
    r = runner.invoke(app, ["embed", "-", "--model", str(MODEL), "--device", "emu"], input=">a\nMKTAYIAKQR\n")
    assert r.exit_code == 0 and "on emu (requested emu, 100% of ops in the NPU program)" in r.stderr


def test_cli_per_residue_npz_is_ragged_with_offsets(tmp_path):
    out = tmp_path / "r.npz"
    r = _embed("-", "-o", out, "--pooling", "per-residue", input=">a\nMKTAYI\n>b\nGS\n>c\nMKTAYIAKQRQISFVKSH\n")
    assert r.exit_code == 0, r.stderr
    with np.load(out) as d:
        assert d["offsets"].tolist() == [0, 6, 8, 26] and d["embeddings"].shape == (26, esm.TINY.hidden_size)


def test_cli_warns_about_nucleotide_records_and_still_embeds_them():
    r = _embed("-", input=NUCLEOTIDES)
    assert r.exit_code == 0, r.stderr
    assert "warning: 2 of 3 records look like nucleotide (DNA/RNA) sequences, not protein: gene1, mrna1;" in r.stderr
    assert "seqkit translate" in r.stderr and len(r.stdout.splitlines()) == 3
    r = _embed("-", input=">p\nMKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ\n>pep\nACGT\n")
    assert r.exit_code == 0 and "warning" not in r.stderr, r.stderr


def test_cli_resume_after_a_finished_run_does_nothing_and_never_overwrites_another_run(tmp_path, monkeypatch):
    fasta = tmp_path / "in.fasta"
    fasta.write_text(">a\nMKTAYIAKQR\n>b\nGSHMLEDPVDAFQA\n")
    out, lines = tmp_path / "x.npz", tmp_path / "x.jsonl"
    assert _embed(fasta, "-o", out).exit_code == 0 and _embed(fasta, "-o", lines).exit_code == 0
    finished = {p: p.read_bytes() for p in (out, lines)}

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(ProteinEmbedder, "__init__", no_model)
    r = _embed(fasta, "-o", out, "--resume")
    assert r.exit_code == 0, r.stderr
    assert f"all 2 sequences are already embedded in {out}" in r.stderr and "embedded 2" not in r.stderr
    # other settings or input: --resume used to recompute and overwrite silently; now it refuses
    r = _embed(fasta, "-o", out, "--pooling", "cls", "--resume")
    assert r.exit_code == 2 and "different settings or input (pooling)" in r.stderr and "drop --resume" in r.stderr
    fasta.write_text(">a\nMKTAYIAKQR\n>b\nGSHMLEDPVDAFQ\n")
    r = _embed(fasta, "-o", out, "--resume")
    assert r.exit_code == 2 and "different settings or input (input)" in r.stderr
    r = _embed(fasta, "-o", lines, "--resume")  # JSON lines cannot say which run made them
    assert r.exit_code == 2 and "does not record" in r.stderr and "pick another -o" in r.stderr
    assert {p: p.read_bytes() for p in (out, lines)} == finished
    monkeypatch.undo()
    r = _embed(fasta, "-o", out)  # without --resume, -o is overwritten as always
    assert r.exit_code == 0 and "embedded 2 sequences" in r.stderr and out.read_bytes() != finished[out]


def test_cli_errors_are_typed(tmp_path, no_npu):
    r = runner.invoke(app, ["embed", "-", "--model", "esm2_t6_8M_UR50D", "--device", "cpu"], input=">a\nMK\n")
    assert r.exit_code == 4 and "huggingface-cli download facebook/esm2_t6_8M_UR50D" in r.stderr and r.stdout == ""
    r = _embed("-", input=">a\nMK\n>b\nGS\n>a\nMK\n")
    assert r.exit_code == 1 and "duplicate sequence ID" in r.stderr
    r = _embed("-", input=">a\nMK7\n")
    assert r.exit_code == 1 and "record 'a'" in r.stderr and "residue 3" in r.stderr
    r = _embed("-", "--format", "npz", input=">a\nMK\n")
    assert r.exit_code == 2
    r = _embed("-", "--layers", "last", input=">a\nMK\n")
    assert r.exit_code == 2 and "--layers" in r.stderr
    r = runner.invoke(app, ["embed", "-", "--model", str(MODEL), "--device", "npu"], input=">a\nMK\n")
    assert r.exit_code == 3 and "NPU" in r.stderr


def test_cli_output_folder_and_unwritable_paths_are_typed_errors(tmp_path):
    (tmp_path / "outdir").mkdir()
    (tmp_path / "afile").write_text("")
    for args in (["-o", tmp_path / "outdir"], ["-o", tmp_path / "outdir", "--format", "npz"]):
        r = _embed("-", *args, input=">a\nMK\n")  # esm-extract takes an output folder
        assert r.exit_code == 2 and "is a folder" in r.stderr and "outdir/embeddings.npz" in r.stderr, r.stderr
    r = _embed("-", "-o", tmp_path / "afile" / "x.npz", input=">a\nMK\n")
    assert r.exit_code == 1 and "cannot write" in r.stderr and "Not a directory" in r.stderr and r.stdout == ""


def test_cli_write_failures_keep_the_work_for_resume(tmp_path, monkeypatch):
    import errno

    import apps.embed as cli_embed
    out = tmp_path / "x.npz"
    fasta = ">a\nMKTAYIAKQR\n>b\nGSHMLEDPVDAFQAKQRQISFVKSHFSRQLEERLGLIEVQ\n"

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(out))

    monkeypatch.setattr(cli_embed, "_write_atomic", disk_full)
    r = _embed("-", "-o", out, "--toks-per-batch", "32", input=fasta)
    assert r.exit_code == 1 and f"cannot write {out}: No space left on device" in r.stderr and "--resume" in r.stderr
    assert len(list((tmp_path / "x.npz.parts").glob("part-*.npz"))) == 2
    monkeypatch.undo()
    r = _embed("-", "-o", out, "--toks-per-batch", "32", "--resume", input=fasta)
    assert r.exit_code == 0 and "resuming: 2 of 2" in r.stderr, r.stderr
    real_part = cli_embed._write_part
    monkeypatch.setattr(cli_embed, "_write_part", lambda parts, *a, **k: (real_part(parts, *a, **k), disk_full()))
    r = _embed("-", "-o", tmp_path / "y.npz", "--toks-per-batch", "32", input=fasta)
    assert r.exit_code == 1 and "cannot write" in r.stderr and "rerun the same command with --resume" in r.stderr


def test_embed_reports_progress_per_batch(monkeypatch):
    """The command drives the shared progress bar (apps/progress.py: drawn only on a terminal) up to every record."""
    import contextlib
    import apps.embed as cmd
    seen = []

    @contextlib.contextmanager
    def recording(label, *, total, unit, enabled=True):
        seen.append((label, total, unit))
        yield seen.append
    monkeypatch.setattr(cmd, "progress", recording)
    r = _embed("-", input=">a\nMKTAYIAK\n>b\nMKV\n>c\nMKTAYIAKQRQISFVKSHF\n")
    assert r.exit_code == 0, r.output
    assert seen[0] == ("embedding", 3, "sequences") and seen[-1] == 3 and seen[1:] == sorted(seen[1:])
