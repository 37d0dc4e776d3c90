"""TextEmbedder end to end on the real all-MiniLM-L6-v2 weights (installed package, offline)."""
from __future__ import annotations

import numpy as np
import pytest

from pipelines.text import TextEmbedder, TextOptions
from sdk.errors import DeviceUnavailable, InputError, ModelNotFound, UsageError

from .conftest import FIXTURES


@pytest.fixture(scope="module")
def embedder():
    with TextEmbedder(device="cpu") as e:
        yield e


def test_reference_similarity(embedder):
    a, b = embedder.embed(["A man is eating food.", "A man is eating a piece of bread."])
    assert a.shape == (384,)
    assert np.linalg.norm(a) == pytest.approx(1.0, abs=1e-6)
    assert float(a @ b) == pytest.approx(0.755, abs=0.001)


def test_padding_a_batch_changes_no_vector(embedder):
    texts = ["short", "a somewhat longer sentence that needs a bigger length bucket than the first one", "mid size one"]
    together = embedder.embed(texts)
    alone = np.stack([embedder.embed(t) for t in texts])
    assert np.abs(together - alone).max() < 1e-5


def test_batches_larger_than_batch_size_keep_order(embedder):
    texts = [f"sentence number {i} " + "word " * (i % 7) for i in range(19)]
    together = embedder.embed(texts)
    for i in (0, 7, 18):
        assert np.abs(together[i] - embedder.embed(texts[i])).max() < 1e-5


def test_empty_list_and_report(embedder):
    assert embedder.embed([]).shape == (0, 384)
    r = embedder.report()
    assert (r["device_requested"], r["device_effective"]) == ("cpu", "cpu")


@pytest.mark.parametrize("texts,message", [
    (None, "got NoneType"), (5, "got int"), ((t for t in ["a"]), "got generator"),
    (np.array(["a", "b"]), "got ndarray"), (["a", None], "text 1 is a NoneType"), ([b"a"], "text 0 is a bytes"),
])
def test_what_is_not_a_list_of_strings_is_a_usage_error(embedder, texts, message):
    with pytest.raises(UsageError, match=message) as e:
        embedder.embed(texts)
    assert e.value.fix


def test_text_that_is_not_unicode_and_bad_options_are_typed_errors(embedder):
    with pytest.raises(InputError, match="text 1 is not valid Unicode"):
        embedder.embed(["fine", "bad \ud800 surrogate"])
    for options in (dict(batch_size=0), dict(max_length=2)):
        with pytest.raises(UsageError, match="must be at least 1"):
            TextOptions(**options)


def test_long_text_is_truncated_with_a_warning():
    with TextEmbedder(device="cpu", options=TextOptions(max_length=16, buckets=(8,))) as e:
        with pytest.warns(UserWarning, match="truncated"):
            v = e.embed(["word " * 40])
    assert v.shape == (1, 384) and np.isfinite(v).all()


def test_auto_falls_back_to_cpu_and_says_why(no_npu):
    with TextEmbedder(device="auto") as e:
        r = e.report()
    assert r["device_requested"] == "auto" and r["device_effective"] == "cpu" and r["fallback_reason"]


def test_strict_npu_is_a_typed_error(no_npu):
    with pytest.raises(DeviceUnavailable) as e:
        TextEmbedder(device="npu")
    assert e.value.exit_code == 3


def test_unknown_model_offline_is_a_typed_error():
    with pytest.raises(ModelNotFound) as e:
        TextEmbedder("someone/not-a-model")
    assert e.value.exit_code == 4 and "offline" in str(e.value)


def test_a_model_of_another_family_is_named_not_loaded_as_bert():
    with pytest.raises(UsageError, match="holds a 'esm' model, not a BERT-family text encoder"):
        TextEmbedder(str(FIXTURES / "esm"))


def test_emulated_npu_embeds_like_the_cpu(embedder, record_parity):
    """Every length and batch bucket in one emulated program (batch-1 buckets read split weights, batch-8
    buckets whole ones): each vector within the emulator's rel-L2 budget (1e-2) of the cpu's."""
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "short"]
    with TextEmbedder(device="emu") as emu:
        got = emu.embed(texts)
        assert emu.report()["device_effective"] == "emu"
        alone = emu.embed(texts[0])
    want = embedder.embed(texts)
    for i, (ours, ref) in enumerate([*zip(got, want), (alone, want[0])]):
        _, rel = record_parity(f"minilm.emu.embedding{i}", ours, ref)
        assert rel <= 1e-2
    assert float(got[0] @ got[1]) == pytest.approx(float(want[0] @ want[1]), abs=3e-3)  # measured 7e-4
