"""Vision pipeline and `aie-apps classify`: preprocessing against transformers' PIL image processors on real
photos, the classifier/embedder APIs, frame sources (camera grabber, video, images, folders, bad input), the
CLI in headless JSON-lines mode, and the overlay window rendered under Xvfb."""
from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import skimage.data
from typer.testing import CliRunner

from apps.classify import draw_overlay, gui_available
from apps.main import app
from pipelines import vision
from sdk.errors import DeviceIOError, InputError, UsageError
from sdk.models import clip

from .conftest import FIXTURES

VISION = FIXTURES / "vision"
PHOTOS = ("chelsea", "coffee", "astronaut")
runner = CliRunner()
sys.path.insert(0, str(FIXTURES))
import make_vision  # noqa: E402  (the processor configs the goldens were made with)


def photo(name: str) -> np.ndarray:
    return getattr(skimage.data, name)()


# ---- preprocessing -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["vit", "dinov2", "clip", "resnet"])
def test_preprocessing_matches_transformers_pil_processors(kind, record_result):
    golden = np.load(VISION / "preprocess.npz")
    pre = vision.Preprocessor.from_config(make_vision.PROCESSORS[kind](make_vision.PREPROCESS_SIZES[kind]))
    for name in PHOTOS:
        ours = pre.resized(photo(name)).astype(np.float64)
        ref = golden[f"{kind}/{name}"].astype(np.float64)
        assert ours.shape == ref.shape
        mean_abs = np.abs(ours - ref).mean() / 255
        worst = np.abs(ours - ref).max()
        record_result(f"preprocess {kind}/{name}: mean-abs {mean_abs:.2e} (of 1.0), max {worst:.0f}/255",
                      **{f"preprocess.{kind}.{name}.mean_abs": float(mean_abs)})
        assert mean_abs <= 1 / 255


def test_normalised_output_is_the_resized_image_rescaled():
    pre = vision.Preprocessor.from_config(make_vision.PROCESSORS["clip"](64))
    image = photo("coffee")
    x = pre(image)
    assert x.shape == (3, 64, 64) and x.dtype == np.float32
    back = (x.transpose(1, 2, 0) * np.array(pre.std) + np.array(pre.mean)) * 255
    assert np.abs(back - pre.resized(image)).max() < 1e-3


def test_config_forms_are_read_like_transformers():
    vit_int = vision.Preprocessor.from_config({"feature_extractor_type": "ViTFeatureExtractor", "size": 224})
    assert (vit_int.resize_to, vit_int.crop, vit_int.resample) == ((224, 224), None, 2)
    clip_int = vision.Preprocessor.from_config({"feature_extractor_type": "CLIPFeatureExtractor", "size": 224,
                                                "crop_size": 224, "do_center_crop": True, "resample": 3})
    assert (clip_int.shortest_edge, clip_int.crop) == (224, (224, 224))
    convnext = vision.Preprocessor.from_config({"feature_extractor_type": "ConvNextFeatureExtractor", "size": 224,
                                                "crop_pct": 0.875, "resample": 3})
    assert (convnext.shortest_edge, convnext.crop, convnext.output_size) == (256, (224, 224), 224)


@pytest.mark.reference
@pytest.mark.parametrize("kind", ["vit", "dinov2", "clip", "resnet"])
def test_live_preprocessing_at_224_against_transformers(kind, record_result):
    from PIL import Image
    config = make_vision.PROCESSORS[kind](224)
    proc = make_vision.processor(config)
    pre = vision.Preprocessor.from_config(config)
    for name in PHOTOS:
        ref = np.asarray(proc(images=Image.fromarray(photo(name)), return_tensors="np")["pixel_values"][0])
        diff = np.abs(pre(photo(name)) - ref) * np.asarray(config["image_std"])[:, None, None]  # in [0, 1] units
        record_result(f"preprocess@224 {kind}/{name}: mean-abs {diff.mean():.2e}, max {diff.max():.2e}",
                      **{f"preprocess224.{kind}.{name}.max_abs": float(diff.max())})
        assert diff.mean() <= 1 / 255


def test_bad_images_are_input_errors(tmp_path):
    junk = tmp_path / "junk.jpg"
    junk.write_bytes(b"\xff\xd8 not really a jpeg")
    with pytest.raises(InputError, match="cannot read"):
        vision.read_image(junk)
    with pytest.raises(InputError, match="no such image"):
        vision.read_image(tmp_path / "missing.png")
    with pytest.raises(InputError, match="uint8"):
        vision.Preprocessor.from_config({})(np.zeros((8, 8, 3), np.float32))
    shortest = vision.Preprocessor.from_config({"image_processor_type": "CLIPImageProcessor", "size": 224,
                                                "crop_size": 224})
    assert shortest.shortest_edge == 224 and shortest(np.zeros((1, 100, 3), np.uint8)).shape == (3, 224, 224)
    with pytest.raises(InputError, match="1x3000 pixels: too elongated"):  # 224 x 672000 once scaled
        shortest(np.zeros((3000, 1, 3), np.uint8))


# ---- classifier and embedder -------------------------------------------------------------------------

def test_classifier_top_k_is_the_softmax_of_the_model_logits():
    from sdk.models import vit
    from sdk.session import Session
    image = photo("chelsea")
    with vision.ImageClassifier(str(VISION / "vit"), device="cpu") as clf:
        preds = clf.classify(image, k=3)
        pixels = clf.preprocess(image)[None]
    cfg, weights = vit.load(VISION / "vit")
    with Session([vit.graph(cfg, 1)], weights, device="cpu") as s:
        logits = s.run(pixels=pixels)["logits"][0]
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert [p.index for p in preds] == list(np.argsort(-probs)[:3])
    assert np.allclose([p.score for p in preds], np.sort(probs)[::-1][:3], atol=1e-6)
    assert preds[0].label == make_vision.LABELS[preds[0].index]  # names from config.json's id2label


def test_batches_give_the_same_answers_as_single_images():
    images = [photo(n) for n in PHOTOS] * 2  # 6 images: one full batch of 4 and a zero-padded batch
    with vision.ImageClassifier(str(VISION / "resnet18"), device="cpu") as clf:
        batch = clf.classify(images, k=2)
        single = [clf.classify(i, k=2) for i in images[:3]]
    assert len(batch) == 6
    for b, s in zip(batch, single):
        assert [p.index for p in b] == [p.index for p in s]
        assert np.allclose([p.score for p in b], [p.score for p in s], atol=1e-5)
    with vision.ImageEmbedder(str(VISION / "dinov2"), device="cpu") as emb:
        vectors = emb.embed(images)
        one = emb.embed(images[1])
    assert vectors.shape == (6, 32) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert np.allclose(vectors[1], one, atol=1e-5) and np.allclose(vectors[0], vectors[3], atol=1e-5)


def test_clip_zero_shot_scores_labels_with_the_text_tower():
    labels = ["tabby cat", "coffee mug", "astronaut"]
    with vision.ImageClassifier(str(VISION / "clip"), labels=labels, device="cpu") as clf:
        preds = clf.classify([photo("chelsea"), photo("coffee")])
        text = clf.text_embeds
    assert [len(p) for p in preds] == [3, 3]
    assert {p.label for p in preds[0]} == set(labels)
    assert abs(sum(p.score for p in preds[0]) - 1) < 1e-5
    assert text.shape == (3, 16) and not np.allclose(text[0], text[1])  # prompts differ, so do embeddings
    # each label's score is its own prompt's: the row of text embeddings a one-label classifier makes for it,
    # against the image embedding, scaled by exp(logit_scale) and softmaxed over the labels
    alone = []
    for label in labels:
        with vision.ImageClassifier(str(VISION / "clip"), labels=[label], device="cpu") as one:
            alone.append(one.text_embeds[0])
    with vision.ImageEmbedder(str(VISION / "clip"), device="cpu") as emb:
        image = emb.embed(photo("chelsea"))
    scale = np.exp(clip.load(VISION / "clip")[1]["logit_scale"].item())
    cos = np.array([row @ image / np.linalg.norm(row) for row in alone]) * scale
    expected = np.exp(cos - cos.max()) / np.exp(cos - cos.max()).sum()
    assert {p.label: p.score for p in preds[0]} == pytest.approx(dict(zip(labels, expected)), abs=1e-5)


def test_model_without_a_head_or_labels_is_a_usage_error():
    from sdk.errors import UsageError
    with pytest.raises(UsageError, match="no classification head"):
        vision.ImageClassifier(str(VISION / "dinov2"), device="cpu")
    with pytest.raises(UsageError, match="needs labels"):
        vision.ImageClassifier(str(VISION / "clip"), device="cpu")


# ---- sources -----------------------------------------------------------------------------------------

class FakeCapture:
    """Stands in for cv2.VideoCapture: a 200 fps camera whose frames carry their sequence number."""

    def __init__(self, device, fail_after: int | None = None, stall: bool = False):
        self.n, self.fail_after, self.stall, self.released = 0, fail_after, stall, False
        self.props = {}

    def isOpened(self):
        return True

    def set(self, prop, value):
        self.props[prop] = value
        return True

    def read(self):
        if self.stall:
            time.sleep(0.05)
            return False, None
        time.sleep(0.005)
        self.n += 1
        if self.fail_after is not None and self.n > self.fail_after:
            return False, None
        return True, np.full((4, 4, 3), self.n % 256, np.uint8)

    def release(self):
        self.released = True


def test_camera_grabber_keeps_only_the_newest_frame():
    fake = FakeCapture(0)
    cam = vision.Camera(0, open_capture=lambda d: fake)
    seen = []
    for frame in cam:
        seen.append(int(frame.image[0, 0, 0]))
        time.sleep(0.05)  # a slow model: ~10 camera frames arrive meanwhile
        if len(seen) == 5:
            break
    cam.close()
    assert fake.released and fake.props[cv2.CAP_PROP_FOURCC] == cv2.VideoWriter_fourcc(*"MJPG")
    assert fake.props[cv2.CAP_PROP_BUFFERSIZE] == 1
    gaps = np.diff(seen)
    assert (gaps > 1).all(), seen    # stale frames were skipped, not queued
    assert cam.dropped >= 10


def test_camera_that_stops_or_stalls_raises_instead_of_hanging():
    cam = vision.Camera(0, open_capture=lambda d: FakeCapture(d, fail_after=3), frame_timeout=5.0)
    with pytest.raises(DeviceIOError, match="stopped delivering"):
        for _ in cam:
            pass
    cam.close()
    t0 = time.perf_counter()
    cam = vision.Camera(0, open_capture=lambda d: FakeCapture(d, stall=True), first_frame_timeout=0.5)
    with pytest.raises(DeviceIOError, match="no frame within|stopped delivering"):
        next(iter(cam))
    cam.close()
    assert time.perf_counter() - t0 < 5
    stream = vision.Camera("rtsp://127.0.0.1/cam", open_capture=lambda d: FakeCapture(0, fail_after=3))
    with pytest.raises(InputError, match="rtsp://127.0.0.1/cam stopped delivering") as e:
        for _ in stream:  # a live stream that ends is not a camera to reconnect
            pass
    stream.close()
    assert "stream" in e.value.fix and "camera" not in e.value.fix


def test_missing_camera_is_a_device_error_with_exit_code_5(monkeypatch):
    with pytest.raises(DeviceIOError, match="no camera at /dev/video47"):
        vision.Camera(47)
    loads = []
    monkeypatch.setattr(vision, "ImageClassifier", lambda *a, **k: loads.append(a))
    r = runner.invoke(app, ["classify", "--camera", "47", "--headless", "--model", str(VISION / "vit"),
                            "--device", "cpu"])
    assert r.exit_code == 5 and "no camera" in r.stderr and "fix:" in r.stderr and r.stdout == ""
    assert loads == []  # found before the model loads, as dictate finds a missing microphone


def make_video(path: Path, frames_per_photo: int = 4, size=(160, 120), fps: float = 10.0) -> int:
    """A real MJPG video of the scikit-image photos; returns how many frames OpenCV reads back from it."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, size)
    for name in PHOTOS:
        for _ in range(frames_per_photo):
            writer.write(cv2.resize(cv2.cvtColor(photo(name), cv2.COLOR_RGB2BGR), size))
    writer.release()
    cap, n = cv2.VideoCapture(str(path)), 0
    while cap.read()[0]:
        n += 1
    cap.release()
    return n


def test_classify_video_headless_jsonl_emits_one_line_per_frame(tmp_path):
    video = tmp_path / "photos.avi"
    n = make_video(video)
    assert n == 12
    r = runner.invoke(app, ["classify", str(video), "--headless", "--json", "--top-k", "3",
                            "--model", str(VISION / "vit"), "--device", "cpu"])
    assert r.exit_code == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(lines) == n
    assert [x["frame"] for x in lines] == list(range(n))
    times = [x["time"] for x in lines]
    assert times == sorted(times) and abs(times[-1] - (n - 1) / 10) < 0.05
    for x in lines:
        assert set(x) == {"source", "frame", "time", "top_k", "latency_ms", "infer_ms", "device"}
        scores = [p["score"] for p in x["top_k"]]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True) and sum(scores) <= 1 + 1e-6
        assert all(p["label"] in make_vision.LABELS for p in x["top_k"])
        assert x["device"] == "cpu" and x["latency_ms"] >= x["infer_ms"] > 0
    # the model sees different photos: predictions change where the video cuts from one photo to the next
    first = [tuple(p["index"] for p in x["top_k"]) + (round(x["top_k"][0]["score"], 4),) for x in lines]
    assert first[0] == first[3] and first[0] != first[4]
    for stage in ("capture", "preprocess", "infer", "postprocess"):
        assert stage in r.stderr
    assert f"{n} frames in" in r.stderr


def test_a_truncated_video_ends_cleanly_with_a_note(tmp_path):
    video = tmp_path / "photos.avi"
    assert make_video(video) == 12
    data = video.read_bytes()
    cut = tmp_path / "cut.avi"
    cut.write_bytes(data[:len(data) * 2 // 3])  # the last frames are gone, the index still lists them
    t0 = time.perf_counter()
    r = runner.invoke(app, ["classify", str(cut), "--headless", "--json", "--model", str(VISION / "vit"),
                            "--device", "cpu"])
    assert r.exit_code == 0, r.stderr
    n = len(r.stdout.splitlines())
    assert 0 < n < 12 and f"{12 - n} unreadable frames skipped" in r.stderr
    assert time.perf_counter() - t0 < 30


class _Server(http.server.SimpleHTTPRequestHandler):
    """Files from the test's folder, at /live an endless MJPEG stream (what IP cameras serve), and at /ends one
    that stops after 10 frames (a camera switched off)."""

    def do_GET(self):
        if self.path not in ("/live", "/ends"):
            return super().do_GET()
        self.send_response(200)
        self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
        self.end_headers()
        jpeg = cv2.imencode(".jpg", cv2.cvtColor(photo("chelsea"), cv2.COLOR_RGB2BGR))[1].tobytes()
        try:
            for _ in range(10) if self.path == "/ends" else iter(int, 1):
                self.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n%s\r\n"
                                 % (len(jpeg), jpeg))
                time.sleep(0.02)
        except OSError:  # the client hung up
            pass

    def log_message(self, *args):
        pass


def test_classify_a_video_url_and_a_live_stream(tmp_path):
    assert make_video(tmp_path / "photos.avi") == 12
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Server, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    model = ["--headless", "--json", "-k", "1", "--model", str(VISION / "vit"), "--device", "cpu"]
    try:
        source = vision.open_source(f"{base}/photos.avi")  # a file on a server: every frame, in order
        assert source.kind == "video" and source.name == f"{base}/photos.avi"
        source.close()
        r = runner.invoke(app, ["classify", f"{base}/photos.avi", *model])
        assert r.exit_code == 0, r.stderr
        lines = [json.loads(line) for line in r.stdout.splitlines()]
        assert [x["frame"] for x in lines] == list(range(12)) and {x["source"] for x in lines} == {f"{base}/photos.avi"}
        r = runner.invoke(app, ["classify", f"{base}/live", *model, "--max-frames", "5"])  # live: newest frame only
        assert r.exit_code == 0, r.stderr
        assert len(r.stdout.splitlines()) == 5 and "stale camera frames dropped" in r.stderr
        # an unreachable address is skipped like a missing file; the run goes on and fails at the end
        r = runner.invoke(app, ["classify", "http://127.0.0.1:9/nothing.mp4", f"{base}/photos.avi", *model])
        assert r.exit_code == 1 and "cannot open http://127.0.0.1:9/nothing.mp4" in r.stderr and "fix:" in r.stderr
        assert len(r.stdout.splitlines()) == 12
        # so is a stream that ends: the sources after it are still classified
        r = runner.invoke(app, ["classify", f"{base}/ends", f"{base}/photos.avi", *model])
        assert r.exit_code == 1 and f"{base}/ends stopped delivering frames" in r.stderr, r.stderr
        assert sum(json.loads(line)["source"] == f"{base}/photos.avi" for line in r.stdout.splitlines()) == 12
    finally:
        server.shutdown()
        server.server_close()


def test_threshold_keeps_confident_labels_and_still_reports_every_frame(tmp_path):
    for name in PHOTOS:
        cv2.imwrite(str(tmp_path / f"{name}.png"), cv2.cvtColor(photo(name), cv2.COLOR_RGB2BGR))
    model = ["--headless", "--model", str(VISION / "vit"), "--device", "cpu"]
    r = runner.invoke(app, ["classify", str(tmp_path), "--json", "-k", "5", "--threshold", "0.11", *model])
    assert r.exit_code == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(lines) == 3
    assert all(p["score"] >= 0.11 for x in lines for p in x["top_k"]) and any(len(x["top_k"]) < 5 for x in lines)
    r = runner.invoke(app, ["classify", str(tmp_path), "--threshold", "0.99", *model])
    assert r.exit_code == 0, r.stderr
    assert r.stdout.count("no label above --threshold") == 3  # no frame disappears from the output
    r = runner.invoke(app, ["classify", str(tmp_path), "--threshold", "1.5", *model])
    assert r.exit_code == 2 and r.stdout == ""
    with pytest.raises(UsageError, match="threshold must be between 0 and 1"):
        vision.VisionOptions(threshold=-0.1)
    with vision.ImageClassifier(str(VISION / "vit"), device="cpu",
                                options=vision.VisionOptions(threshold=0.11)) as clf:
        assert [p.score >= 0.11 for p in clf.classify(photo("chelsea"))] == [True]
    assert draw_overlay(photo("astronaut"), [], 3.0, 30.0, "cpu").shape == photo("astronaut").shape


def test_one_clip_label_is_a_usage_error_that_points_at_the_file(tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("tabby cat\ncoffee mug\n")
    cv2.imwrite(str(tmp_path / "cat.png"), cv2.cvtColor(photo("chelsea"), cv2.COLOR_RGB2BGR))
    model = ["--headless", "--model", str(VISION / "clip"), "--device", "cpu"]
    r = runner.invoke(app, ["classify", str(tmp_path), "--labels", str(labels), *model])  # --labels FILE, as Coral
    assert r.exit_code == 2 and r.stdout == ""  # not every frame "labels.txt 1.000"
    assert f"pass --labels @{labels}" in r.stderr
    r = runner.invoke(app, ["classify", str(tmp_path), "--labels", "cat", *model])
    assert r.exit_code == 2 and "always score 100%" in r.stderr and "two or more labels" in r.stderr
    r = runner.invoke(app, ["classify", str(tmp_path), "--labels", f"@{labels}", *model])
    assert r.exit_code == 0, r.stderr


def test_classify_images_and_folders_with_a_bad_file(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in PHOTOS:
        cv2.imwrite(str(folder / f"{name}.png"), cv2.cvtColor(photo(name), cv2.COLOR_RGB2BGR))
    (folder / "broken.jpg").write_bytes(b"not an image")
    r = runner.invoke(app, ["classify", str(folder), "--headless", "--model", str(VISION / "vit"),
                            "--device", "cpu", "-k", "1"])
    assert r.exit_code == 1  # the bad file fails the run, after every other image was classified
    assert "cannot read" in r.stderr and "broken.jpg" in r.stderr
    assert len(r.stdout.splitlines()) == 3 and all(f"{n}.png" in r.stdout for n in PHOTOS)
    r = runner.invoke(app, ["classify", str(folder / "chelsea.png"), "--headless", "--json", "--device", "cpu",
                            "--model", str(VISION / "clip"), "--labels", "tabby cat,coffee mug"])
    assert r.exit_code == 0, r.stderr
    (line,) = r.stdout.splitlines()
    assert {p["label"] for p in json.loads(line)["top_k"]} == {"tabby cat", "coffee mug"}


def test_classify_skips_a_missing_source_and_keeps_going(tmp_path):
    good = tmp_path / "cat.png"
    cv2.imwrite(str(good), cv2.cvtColor(photo("chelsea"), cv2.COLOR_RGB2BGR))
    (tmp_path / "broken.jpg").write_bytes(b"not an image")
    r = runner.invoke(app, ["classify", str(tmp_path / "nonexist.png"), str(tmp_path / "broken.jpg"), str(good),
                            "--headless", "--model", str(VISION / "vit"), "--device", "cpu", "-k", "1"])
    assert r.exit_code == 1  # after every source that could be read was classified, like transcribe
    assert "no such file or folder" in r.stderr and "cannot read" in r.stderr
    assert r.stderr.count("fix:") == 2  # each error says what to do
    (line,) = r.stdout.splitlines()
    assert line.startswith(str(good))


def test_classify_without_a_source_to_read_does_not_load_the_model(tmp_path, monkeypatch):
    def load(*args, **kwargs):
        raise AssertionError("the model was loaded although no source could be read")
    monkeypatch.setattr(vision, "ImageClassifier", load)
    r = runner.invoke(app, ["classify", str(tmp_path / "gone.png"), str(tmp_path / "gone"), str(tmp_path),
                            "--headless", "--model", str(VISION / "vit"), "--device", "cpu"])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output  # not the AssertionError
    assert f"error: no such file or folder: {tmp_path / 'gone.png'}\n  fix: check the path" in r.stderr
    assert f"no such file or folder: {tmp_path / 'gone'}\n" in r.stderr
    assert f"no images in folder {tmp_path}\n" in r.stderr and r.stderr.count("fix:") == 3
    assert r.stdout == ""


def test_classify_labels_file_that_is_not_utf8_is_an_input_error(tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_bytes(b"\xff\xfe tabby cat\n")
    r = runner.invoke(app, ["classify", str(tmp_path), "--labels", f"@{labels}", "--headless",
                            "--model", str(VISION / "clip"), "--device", "cpu"])
    assert r.exit_code == 1 and "cannot read labels file" in r.stderr and "fix:" in r.stderr
    assert isinstance(r.exception, SystemExit)  # typer.Exit, not a traceback
    r = runner.invoke(app, ["classify", str(tmp_path), "--labels", "\udcff,cat", "--headless",  # argv byte 0xff
                            "--model", str(VISION / "clip"), "--device", "cpu"])
    assert r.exit_code == 1 and "--labels is not valid UTF-8" in r.stderr and isinstance(r.exception, SystemExit)


def test_classify_usage_errors_and_automatic_headless(tmp_path, monkeypatch, no_npu):
    r = runner.invoke(app, ["classify", "--model", str(VISION / "vit"), "--device", "cpu"])
    assert r.exit_code == 2 and "nothing to classify" in r.stderr
    r = runner.invoke(app, ["classify", str(tmp_path / "nope.mp4"), "--model", str(VISION / "vit"), "--headless"])
    assert r.exit_code == 1 and "no such file" in r.stderr
    image = tmp_path / "cat.png"
    cv2.imwrite(str(image), photo("chelsea"))
    r = runner.invoke(app, ["classify", str(tmp_path), "--model", "nobody/no-such-vit", "--headless"])
    assert r.exit_code == 4 and "offline" in r.stderr and "fix:" in r.stderr
    r = runner.invoke(app, ["classify", str(tmp_path), "--model", str(VISION / "dinov2"), "--headless"])
    assert r.exit_code == 2 and "no classification head" in r.stderr
    r = runner.invoke(app, ["classify", str(tmp_path), "--model", str(VISION / "vit"), "--headless", "--device", "npu"])
    assert r.exit_code == 3 and "NPU" in r.stderr and r.stdout == ""  # strict: no silent CPU fallback
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    r = runner.invoke(app, ["classify", str(image), "--model", str(VISION / "vit"), "--device", "cpu"])
    assert r.exit_code == 0 and "running headless" in r.stderr and len(r.stdout.splitlines()) == 1


def test_list_cameras_without_cameras(monkeypatch):
    monkeypatch.setattr(vision, "list_cameras", lambda probe=True: [])
    r = runner.invoke(app, ["classify", "--list-cameras"])
    assert r.exit_code == 0 and "no cameras found" in r.stderr and r.stdout == ""
    fake = [{"index": 0, "path": "/dev/video0", "name": "UVC Camera", "usable": True, "size": [640, 480]}]
    monkeypatch.setattr(vision, "list_cameras", lambda probe=True: fake)
    r = runner.invoke(app, ["classify", "--list-cameras", "--json"])
    assert json.loads(r.stdout) == fake[0]
    r = runner.invoke(app, ["classify", "--list-cameras", "photos/"])  # the source would be ignored
    assert r.exit_code == 2 and "classifies nothing" in r.stderr and r.stdout == ""


def test_no_window_without_a_display_opencv_can_reach(tmp_path, monkeypatch):
    image = tmp_path / "cat.png"
    cv2.imwrite(str(image), photo("chelsea"))
    # a Wayland session without XWayland: the wheel's Qt has only its X11 plugin and would abort the process
    env = {k: v for k, v in os.environ.items() if k != "DISPLAY"}
    env.update(XDG_SESSION_TYPE="wayland", WAYLAND_DISPLAY="wayland-0",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    cli = subprocess.run([sys.executable, "-m", "apps.main", "classify", str(image), "--model", str(VISION / "vit"),
                          "--device", "cpu", "-k", "1"], env=env, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert "running headless" in cli.stderr and len(cli.stdout.splitlines()) == 1
    monkeypatch.setattr(cv2, "getBuildInformation", lambda: "  GUI:                           NONE\n")
    usable, why = gui_available()  # opencv-python-headless: no imshow at all
    assert not usable and "opencv-python-headless" in why


# ---- the overlay window under Xvfb -------------------------------------------------------------------

def test_overlay_window_renders_under_xvfb(tmp_path):
    for tool in ("Xvfb", "xwd", "convert", "xdotool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (Debian: xvfb x11-apps imagemagick xdotool)")
    video = tmp_path / "cat.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10, (320, 240))
    frame = cv2.resize(cv2.cvtColor(photo("chelsea"), cv2.COLOR_RGB2BGR), (320, 240))
    for _ in range(300):  # 30 s at the file's own rate: the window stays up until we press q
        writer.write(frame)
    writer.release()
    display = f":{90 + os.getpid() % 500}"
    xvfb = subprocess.Popen(["Xvfb", display, "-screen", "0", "800x600x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {**os.environ, "DISPLAY": display, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cli = None
    try:
        time.sleep(1.0)
        assert xvfb.poll() is None, "Xvfb did not start"
        cli = subprocess.Popen([sys.executable, "-m", "apps.main", "classify", str(video), "--model",
                                str(VISION / "vit"), "--device", "cpu", "-k", "1"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        shot, image, on_screen = tmp_path / "shot.png", None, np.inf
        expected = cv2.resize(frame, (480, 360), interpolation=cv2.INTER_NEAREST).astype(np.float64)
        banner = 14 + 28 * 2
        try:  # the window first (model load + first frame), then screenshots of it wherever it was placed
            wid = subprocess.run(["xdotool", "search", "--sync", "--name", "aie-apps classify"], env=env,
                                 capture_output=True, text=True, timeout=30).stdout.split()
        except subprocess.TimeoutExpired:  # say why: the CLI's own account is in its stderr
            running = cli.poll() is None
            cli.kill()
            _, errs = cli.communicate(timeout=10)
            state = "still running" if running else "exited"
            pytest.fail(f"no 'aie-apps classify' window after 30 s (classify {state}, code {cli.returncode}); "
                        f"its stderr:\n{errs[-3000:]}")
        for _ in range(48):  # poll until the frame is in the window, at most ~12 s
            time.sleep(0.25)
            xwd = subprocess.run(["xwd", "-id", wid[0], "-silent", "-display", display], capture_output=True,
                                 timeout=10)
            subprocess.run(["convert", "xwd:-", str(shot)], input=xwd.stdout, capture_output=True, timeout=10)
            image = cv2.imread(str(shot))
            if image is not None and image.shape[0] >= 360 and image.shape[1] >= 480:
                on_screen = np.abs(image[banner:360, :480] - expected[banner:]).mean()
                if on_screen < 12:
                    break
        # then press q in the window: the run ends early and cleanly
        for command in (["windowfocus", "--sync", wid[0]], ["key", "q"]):
            subprocess.run(["xdotool", *command], env=env, capture_output=True, timeout=10)
        out, errs = cli.communicate(timeout=60)
    finally:
        if cli is not None and cli.poll() is None:
            cli.kill()
        xvfb.terminate()
        xvfb.wait(timeout=10)
    assert cli.returncode == 0, errs
    assert "running headless" not in errs and "display" in errs  # the window path ran, with its stage
    assert image is not None and image.std() > 20, "the screenshot is blank"
    window = image[:360, :480].astype(np.float64)
    assert on_screen < 12, f"the frame is not on screen (mean difference {on_screen:.1f})"
    text = (window[:banner] > 200).all(axis=2)
    assert text.sum() > 300  # white label/score and "infer ... ms  FPS ..." lines on the dark banner
    assert window[:banner].mean() < expected[:banner].mean()
    assert 0 < len(out.splitlines()) < 300  # one line per shown frame, until q (before the video ends)


def test_overlay_drawing_puts_text_on_a_darkened_banner():
    frame = photo("astronaut")  # 512 wide: drawn at its own size
    pred = [vision.Prediction("tabby cat", 0.87, 0)]
    out = draw_overlay(frame, pred, 12.5, 29.7, "cpu")
    assert out.shape == frame.shape  # wide enough: not rescaled
    plain = cv2.cvtColor(frame, cv2.COLOR_RGB2BGR)
    assert (out[:70] != plain[:70]).any() and (out[80:] == plain[80:]).all()
