"""Issue #26 item 8: a pipeline object shared by threads gives every thread the results it would get alone
(ProteinEmbedder rebuilt its session for new shapes while another thread ran on it)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from pipelines.protein import ProteinEmbedder, ProteinOptions
from pipelines.text import TextEmbedder

from .conftest import FIXTURES

SEQUENCES = ["MKTAYIAKQR" * k for k in (1, 3, 6, 12)]  # each length its own bucket: shapes arrive one by one


def _hammer(fn, inputs, rounds=3):
    errors, results = [], {}

    def work(i):
        try:
            for _ in range(rounds):
                results[i] = fn(inputs[i])
        except Exception as e:  # noqa: BLE001 - what the test looks for
            errors.append(repr(e))
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors, results


def test_protein_embedder_shared_by_four_threads():
    alone = ProteinEmbedder(str(FIXTURES / "esm"), device="cpu", options=ProteinOptions(max_len=200))
    expected = [alone.embed([s]) for s in SEQUENCES]
    for _ in range(3):  # fresh embedders: every round starts with no session, so the threads race to build it
        shared = ProteinEmbedder(str(FIXTURES / "esm"), device="cpu", options=ProteinOptions(max_len=200))
        errors, results = _hammer(lambda s: shared.embed([s]), SEQUENCES)
        assert not errors, errors
        for i, e in enumerate(expected):
            np.testing.assert_allclose(results[i], e, atol=1e-5)


def test_text_embedder_shared_by_four_threads():
    texts = [["a cat"], ["a dog sat on the mat today"], ["words " * 20], ["x"]]
    with TextEmbedder(device="cpu") as t:
        expected = [t.embed(x) for x in texts]
        errors, results = _hammer(t.embed, texts)
    assert not errors, errors
    for i, e in enumerate(expected):
        np.testing.assert_allclose(results[i], e, atol=1e-5)



@pytest.mark.parametrize("kind", ["classifier", "embedder"])
def test_vision_pipelines_shared_by_four_threads(kind):
    # the emulator runs every step in one scratch arena per session, as the NPU does: unguarded, two threads'
    # runs overwrite each other's activations
    from pipelines.vision import ImageClassifier, ImageEmbedder
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (40 + 8 * i, 48, 3), dtype=np.uint8) for i in range(4)]
    if kind == "classifier":
        model = ImageClassifier(str(FIXTURES / "vision" / "vit"), device="emu")
        run = lambda x: np.array([(p.index, p.score) for p in model.classify(x, k=10)])  # noqa: E731
    else:
        model = ImageEmbedder(str(FIXTURES / "vision" / "dinov2"), device="emu")
        run = model.embed
    with model:
        expected = [run(x) for x in images]
        errors, results = _hammer(run, images)
    assert not errors, errors
    for i, e in enumerate(expected):
        np.testing.assert_allclose(results[i], e, atol=1e-6)
