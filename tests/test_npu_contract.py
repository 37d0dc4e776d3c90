"""The NPU path end to end as a Ryzen AI owner walks it, without the hardware or the toolchain:

    aie-apps build MODEL --target T        (kernels/build.py for real, against tests/fake_toolchain.py)
    aie-apps <command> --device npu ...    (the pipeline, against tests/fake_pyxrt.py on a faked Ryzen AI machine)

The command must find every artifact its program needs in the manifest the build wrote (the build compiled exactly
what the pipeline loads, so the content keys agree) and run to the end with the same output as `--device emu`.
Per model family: the TINY fixtures, plus the real all-MiniLM-L6-v2 and Whisper tiny.en. EMULATED throughout: the
fake pyxrt executes each dispatch with the emulator's semantics.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from apps.main import app
from sdk.runtime import npu_artifacts

from . import fake_pyxrt, fake_toolchain
from .conftest import FIXTURES
from .test_npu_backend import fake_npu  # noqa: F401  (the fixture: a fake Ryzen AI laptop)

runner = CliRunner()
TARGETS = ("npu1", "npu2")
SPEECH = "hello world"


def _tiny_bert(folder):
    """The BERT fixture with a word-level tokenizer inside its 99-token vocabulary (the fixture has none)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURES / "bert" / name, folder / name)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "man", "is", "eating", "food", "bread", "piece", "of", "."]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2),
                                                                                               ("[SEP]", 3)])
    tok.save(str(folder / "tokenizer.json"))
    return folder


def _tiny_whisper(folder):
    """The Whisper fixture (96 tokens) with a word-level tokenizer laid out as Whisper's: words, the special
    tokens (<|endoftext|> .. <|notimestamps|>), then the timestamps from <|0.00|>."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    folder.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(FIXTURES / "whisper" / "hf" / name, folder / name)
    specials = ["<|endoftext|>", "<|startoftranscript|>", "<|translate|>", "<|transcribe|>", "<|startoflm|>",
                "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    timestamps = [f"<|{0.02 * i:.2f}|>" for i in range(18)]
    vocab = [*(f"w{i}" for i in range(96 - len(specials) - len(timestamps))), *specials, *timestamps]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    return folder


def _image(path):
    import cv2
    rng = np.random.default_rng(0)
    cv2.imwrite(str(path), rng.integers(0, 256, (40, 48, 3), np.uint8))
    return path


def _speech(path):
    import subprocess
    subprocess.run(["flite", "-voice", "slt", "-t", SPEECH, "-o", str(path)], check=True)
    return path


def _fasta(path):
    path.write_text(">short\nMKTAYIAKQR\n>longer\nGSHMLEDPVDAFQAMKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ\n")
    return path


def _proteins(out: str) -> list:
    return [(d["id"], d["embedding"]) for d in map(json.loads, out.splitlines())]


def _texts(out: str) -> list:
    return [{"text": d["text"], "embedding": d["embedding"]} for d in map(json.loads, out.splitlines())]


def _classes(out: str) -> list:
    return [(d["frame"], d["top_k"]) for d in map(json.loads, out.splitlines())]


def _transcript(out: str) -> list:
    return [(d["text"], d["segments"]) for d in json.loads(out)]


# (model or a maker of its folder, the command's arguments after the model, how to read its result)
CASES = {
    "bert-tiny": (_tiny_bert, lambda tmp: ["embed-text", "a man is eating food .", "a piece of bread ."], _texts),
    "vit-tiny": (str(FIXTURES / "vision" / "vit"),
                 lambda tmp: ["classify", str(_image(tmp / "x.png")), "--json", "--headless"], _classes),
    "resnet-tiny": (str(FIXTURES / "vision" / "resnet18"),
                    lambda tmp: ["classify", str(_image(tmp / "x.png")), "--json", "--headless"], _classes),
    "parakeet-ctc-tiny": (str(FIXTURES / "conformer" / "parakeet_ctc"),
                          lambda tmp: ["transcribe", str(_speech(tmp / "s.wav")), "--format", "json"], _transcript),
    "parakeet-tdt-tiny": (str(FIXTURES / "conformer" / "parakeet_tdt"),
                          lambda tmp: ["transcribe", str(_speech(tmp / "s.wav")), "--format", "json"], _transcript),
    "gigaam-rnnt-tiny": (str(FIXTURES / "conformer" / "gigaam_rnnt"),   # rotary attention under a key mask
                         lambda tmp: ["transcribe", str(_speech(tmp / "s.wav")), "--format", "json"], _transcript),
    "esm-tiny": (str(FIXTURES / "esm"), lambda tmp: ["embed", str(_fasta(tmp / "p.fasta"))], _proteins),
    "all-MiniLM-L6-v2": ("all-MiniLM-L6-v2",
                         lambda tmp: ["embed-text", "A man is eating food.", "A man is eating a piece of bread."],
                         _texts),
    "whisper-tiny": (_tiny_whisper,
                     lambda tmp: ["transcribe", str(_speech(tmp / "s.wav")), "--format", "json"], _transcript),
    "whisper-tiny.en": ("whisper-tiny.en",
                        lambda tmp: ["transcribe", str(_speech(tmp / "s.wav")), "--format", "json"], _transcript),
}


def _cli(args: list[str]):
    r = runner.invoke(app, args)
    assert r.exit_code == 0, f"aie-apps {' '.join(args)} -> {r.exit_code}\n{r.output}"
    return r


EMULATED: dict[str, object] = {}   # the --device emu result per case: one run serves both targets


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", list(CASES))
def test_built_artifacts_are_what_the_command_loads(fake_npu, monkeypatch, tmp_path, case, target):  # noqa: F811
    model, command, read = CASES[case]
    model = str(model(tmp_path / "model")) if callable(model) else model
    prebuilt = fake_npu(target)
    with fake_toolchain.installed(tmp_path / "toolchain", monkeypatch):
        built = json.loads(_cli(["build", model, "--target", target, "--out", str(prebuilt)]).stdout)
    assert list(npu_artifacts.read_manifest(prebuilt / "manifest.json")) == [built["key"]]

    args = command(tmp_path)
    on_npu = _cli([*args, "--model", model, "--device", "npu"])
    assert fake_pyxrt.FAKE.dispatches, "the command ran nothing on the (fake) NPU"
    if case not in EMULATED:
        EMULATED[case] = read(_cli([*args, "--model", model, "--device", "emu"]).stdout)
    assert read(on_npu.stdout) == EMULATED[case]


def test_build_list_whisper_is_what_transcriber_compiles():
    """`aie-apps build --list whisper-tiny.en` names the entries, input shapes and content key of the program
    Transcriber("whisper-tiny.en") runs (on emu, compiled for npu2 as the npu backend would)."""
    from pipelines.asr import Transcriber
    listed = json.loads(_cli(["build", "--list", "whisper-tiny.en", "--target", "npu2", "--json"]).stdout)
    program = Transcriber("whisper-tiny.en", device="emu").recognizer.session.program
    assert [e["entry"] for e in listed["entries"]] == list(program.entries)
    for e in listed["entries"]:
        inputs = program.entries[e["entry"]].inputs
        assert e["inputs"] == {n: list(program.buffers[b].shape) for n, b in inputs.items()}
    assert listed["keys"] == {"npu2": program.meta["content_key"]}


def test_build_list_esm_is_what_protein_embedder_compiles():
    """`aie-apps build --list` of the ESM-2 fixture names every length bucket at each batch size, and the content
    key of the program ProteinEmbedder runs with the default options (whatever lengths it meets)."""
    from pipelines.protein import ProteinEmbedder
    listed = json.loads(_cli(["build", "--list", str(FIXTURES / "esm"), "--target", "npu2", "--json"]).stdout)
    with ProteinEmbedder(str(FIXTURES / "esm"), device="emu") as embedder:
        embedder.embed(["MKTAYIAKQR", "G" * 300])
        program = embedder.session.program
    assert [e["entry"] for e in listed["entries"]] == list(program.entries)
    assert {e["entry"] for e in listed["entries"]} >= {"esm_b1_t64", "esm_b1_t1024"}
    assert listed["keys"] == {"npu2": program.meta["content_key"]}


# ---- the same commands on a real Ryzen AI NPU (skipped without one) ----------------------------------------------

def _close_embeddings(ours: list, ref: list) -> bool:
    a, b = (np.array([d["embedding"] for d in x]) for x in (ours, ref))
    return [d["text"] for d in ours] == [d["text"] for d in ref] and \
        float(np.linalg.norm(a - b) / np.linalg.norm(b)) <= 1e-2


@pytest.mark.npu
@pytest.mark.parametrize("case", ["all-MiniLM-L6-v2", "whisper-tiny.en"])
def test_real_npu_command_matches_emu(case, tmp_path):
    """After `aie-apps build --all --target npu1|npu2` on a Ryzen AI machine: the command finds its artifacts and
    gives the emulator's result (the same words; embeddings within rel-L2 1e-2: hardware rounding is not the
    emulator's bit for bit)."""
    model, command, read = CASES[case]
    args = command(tmp_path)
    on_npu = read(_cli([*args, "--model", model, "--device", "npu"]).stdout)
    emulated = read(_cli([*args, "--model", model, "--device", "emu"]).stdout)
    if read is _texts:
        assert _close_embeddings(on_npu, emulated)
    else:
        assert [text for text, _ in on_npu] == [text for text, _ in emulated]


# ---- the build command's own behaviour ------------------------------------------------------------------------

def test_an_unknown_model_is_named_before_the_missing_toolchain():
    r = runner.invoke(app, ["build", "foo", "--target", "npu2"])
    assert r.exit_code == 4 and "'foo'" in r.stderr and "toolchain" not in r.stderr


def test_build_all_builds_smoke_and_each_installed_model_and_reports_the_rest(monkeypatch, tmp_path):
    from kernels import build as kbuild
    from sdk import hub

    def no_download(*args):
        raise AssertionError("build --all must never download")
    monkeypatch.setattr(hub, "download", no_download)
    found, missing = kbuild.installed_models()
    assert {"all-MiniLM-L6-v2", "whisper-tiny.en"} <= set(found) and not set(found) & set(missing)
    monkeypatch.setattr(kbuild, "installed_models", lambda: ([str(FIXTURES / "bert"), str(FIXTURES / "esm")],
                                                             ["esm2_t6_8M_UR50D"]))
    with fake_toolchain.installed(tmp_path / "toolchain", monkeypatch):
        r = runner.invoke(app, ["build", "--all", "--target", "npu2", "--out", str(tmp_path / "prebuilt")])
    assert r.exit_code == 0, r.output   # a model not installed is said, not a failure
    assert [json.loads(line)["model"] for line in r.stdout.splitlines()] == \
        ["smoke", str(FIXTURES / "bert"), str(FIXTURES / "esm")]
    assert "esm2_t6_8M_UR50D is not installed" in r.stderr
    assert len(npu_artifacts.read_manifest(tmp_path / "prebuilt" / "manifest.json")) == 3
