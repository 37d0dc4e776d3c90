"""Issue #26 items 2, 5, 6, 7, 14 and 15 (user inputs and environment): text lines, FASTA and images are read
within documented bounds; unreadable images are skipped; a missing home folder, an unreachable DISPLAY and a
huge AIE_APPS_THREADS are typed errors or notes, never tracebacks or aborts."""
from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

from apps.main import app
from pipelines.protein import read_fasta
from pipelines.text import read_lines
from pipelines.vision import image_file, read_image
from sdk import settings
from sdk.errors import InputError, SdkError, UsageError

from .conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


# ---- text lines (embed-text) ---------------------------------------------------------------------------

def test_one_row_per_newline_even_with_unicode_line_separators():
    lines = read_lines(io.BytesIO("a\u2028b\nc\u0085d\r\ne\x0cf\n".encode()), "stdin")
    assert lines == ["a\u2028b", "c\u0085d", "e\x0cf"]


def test_a_byte_order_mark_is_not_part_of_the_first_text():
    lines = read_lines(io.BytesIO("\ufeffhello\r\n\ufeffworld\n".encode()), "notepad.txt")
    assert lines == ["hello", "\ufeffworld"]  # only a mark before the first line is the encoding's, not text


def test_blank_lines_are_refused_with_their_numbers():
    with pytest.raises(InputError, match=r"blank lines \(2, 4\)"):
        read_lines(io.BytesIO(b"one\n\ntwo\n  \nthree\n"), "stdin")


def test_endless_input_without_newlines_is_bounded(tmp_path):
    with open("/dev/zero", "rb") as f, pytest.raises(InputError, match="line 1 of /dev/zero is longer than"):
        read_lines(f, "/dev/zero")
    with pytest.raises(InputError, match="more than 1,000 bytes"):
        read_lines(io.BytesIO(b"y\n" * 1000), "stdin", max_bytes=1000)


def test_embed_text_rows_match_input_lines():
    r = runner.invoke(app, ["embed-text", "--device", "cpu"], input="first\u2028half\nsecond\n".encode())
    assert r.exit_code == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2
    r = runner.invoke(app, ["embed-text", "--file", "/dev/zero", "--device", "cpu"])
    assert r.exit_code == 1 and "longer than" in r.stderr and "fix:" in r.stderr


# ---- FASTA -----------------------------------------------------------------------------------------------

def test_fasta_from_dev_zero_is_bounded():
    with pytest.raises(InputError, match="longer than 16,777,216 characters"):
        read_fasta(Path("/dev/zero"))


def test_fasta_record_and_input_limits_are_parameters(tmp_path):
    (tmp_path / "a.fasta").write_text(">a\n" + "ACDE\n" * 10 + ">b\nKL\n")
    assert [r.id for r in read_fasta(tmp_path / "a.fasta")] == ["a", "b"]
    with pytest.raises(InputError, match="record 'a' .* more than 20 residues"):
        read_fasta(tmp_path / "a.fasta", max_record=20)
    with pytest.raises(InputError, match="longer than 30 characters"):
        read_fasta(tmp_path / "a.fasta", max_input=30)


# ---- images ---------------------------------------------------------------------------------------------

def _png(width: int, height: int) -> bytes:
    """A valid PNG header declaring width x height, with one small (deflate-bomb-free) IDAT."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 1024)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("side", [20000, 30000, 100000])
def test_huge_declared_images_are_refused_from_the_header(tmp_path, side):
    path = tmp_path / "big.png"
    path.write_bytes(_png(side, side))
    with pytest.raises(InputError, match=f"declares {side} x {side} pixels"):
        read_image(path)


@pytest.mark.parametrize("ext", [".png", ".jpg", ".bmp", ".webp", ".gif", ".ppm"])
def test_the_header_sizes_agree_with_the_decoder(tmp_path, ext):
    from pipelines.vision.image_size import declared_size
    image = np.random.default_rng(0).integers(0, 255, (37, 53, 3), np.uint8)
    path = tmp_path / f"x{ext}"
    if ext == ".gif":
        from PIL import Image
        Image.fromarray(image).save(path)
    else:
        assert cv2.imwrite(str(path), image)
    assert declared_size(path.read_bytes()) == (53, 37)
    assert read_image(path).shape == (37, 53, 3)
    with pytest.raises(InputError, match="declares 53 x 37"):
        read_image(path, max_pixels=1000)


def test_classify_reports_an_unreadable_image_and_goes_on_with_the_folder(tmp_path, monkeypatch):
    for name in ("a.png", "b.png", "c.png"):
        cv2.imwrite(str(tmp_path / name), np.full((40, 40, 3), 128, np.uint8))
    real = np.fromfile

    def fromfile(path, *a, **k):  # root reads any file, so the denial is simulated at the read
        if Path(path).name == "b.png":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *a, **k)
    monkeypatch.setattr(image_file.np, "fromfile", fromfile)  # where read_image reads the file
    r = runner.invoke(app, ["classify", str(tmp_path), "--model", str(FIXTURES / "vision" / "vit"), "--device", "cpu",
                            "--headless", "--json", "-k", "1"])
    assert r.exit_code == 1 and "cannot read" in r.stderr and "b.png" in r.stderr and "Permission denied" in r.stderr
    assert len(r.stdout.splitlines()) == 2  # a.png and c.png


# ---- environment ---------------------------------------------------------------------------------------

def test_no_home_and_no_passwd_entry_is_a_typed_error_unless_folders_are_given(monkeypatch):
    def no_home():
        raise RuntimeError("Could not determine home directory.")
    monkeypatch.setattr(settings.Path, "home", staticmethod(no_home))
    with pytest.raises(SdkError, match="HOME is not set and uid") as e:
        settings.load({})
    assert "XDG_CACHE_HOME" in e.value.fix
    assert settings.load({"XDG_CACHE_HOME": "/tmp/c"}).home == Path("/tmp/c/aie-apps")
    assert settings.load({"AIE_APPS_HOME": "/tmp/a", "HF_HOME": "/tmp/h"}).hf_cache == Path("/tmp/h/hub")


def test_the_cli_without_home_or_passwd_entry_prints_the_typed_error():
    """As in a container run with `--user 54321`: no HOME, and the uid has no passwd entry."""
    code = ("import pwd, sys\n"
            "def missing(uid): raise KeyError(f'getpwuid(): uid not found: {uid}')\n"
            "pwd.getpwuid = missing\n"
            "sys.argv = ['aie-apps', 'embed-text', 'x']\n"
            "from apps.main import app\n"
            "app()\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "HOME is not set" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_huge_thread_counts_are_refused():
    with pytest.raises(SdkError, match="AIE_APPS_THREADS=99999999999"):
        settings.load({"HOME": "/tmp", "AIE_APPS_THREADS": "99999999999"})
    assert settings.load({"HOME": "/tmp", "AIE_APPS_THREADS": "3"}).threads == 3


def test_an_unreachable_display_means_headless_with_a_note():
    from apps.classify import x11_reachable
    assert not x11_reachable(":9876") and not x11_reachable("127.0.0.1:9876") and not x11_reachable("nonsense")
    env = {**os.environ, "DISPLAY": ":9876", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    env.pop("WAYLAND_DISPLAY", None)
    env.pop("XDG_SESSION_TYPE", None)
    image = FIXTURES.parent / "fixtures" / "vision"
    r = subprocess.run([sys.executable, "-c", "from apps.classify import gui_available; print(gui_available())"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "does not answer" in r.stdout, (r.stdout, r.stderr[-500:], image)


# ---- the limits above as command-line flags ------------------------------------------------------------

def test_input_limits_are_command_line_flags(tmp_path):
    long_line = tmp_path / "long.txt"
    long_line.write_text("word " * 300_000 + "\nshort\n")  # a 1.5 MB line: past the 1 MiB default
    r = runner.invoke(app, ["embed-text", "--file", str(long_line), "--device", "cpu"])
    assert r.exit_code == 1 and "longer than 1,048,576 bytes" in r.stderr and "--max-line-size" in r.stderr
    r = runner.invoke(app, ["embed-text", "--file", str(long_line), "--max-line-size", "2M", "--device", "cpu"])
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 2, r.stderr
    r = runner.invoke(app, ["embed-text", "--max-input-size", "1K", "--device", "cpu"], input=b"y\n" * 1000)
    assert r.exit_code == 1 and "more than 1,024 bytes" in r.stderr and "--max-input-size" in r.stderr
    for bad in ("0", "12X", "-5"):
        r = runner.invoke(app, ["embed-text", "--max-input-size", bad, "x"])
        assert r.exit_code == 2 and "not a size" in r.stderr, (bad, r.stderr)

    fasta = tmp_path / "a.fasta"
    fasta.write_text(">a\n" + "ACDE\n" * 10 + ">b\nKL\n")
    r = runner.invoke(app, ["embed", str(fasta), "--max-record", "20", "--device", "cpu"])
    assert r.exit_code == 1 and "more than 20 residues" in r.stderr and "--max-record" in r.stderr
    r = runner.invoke(app, ["embed", str(fasta), "--max-input-size", "30", "--device", "cpu"])
    assert r.exit_code == 1 and "longer than 30 characters" in r.stderr and "--max-input-size" in r.stderr
    r = runner.invoke(app, ["embed", str(fasta), "--max-input-size", "1G", "--max-record", "40",
                            "--model", str(FIXTURES / "esm"), "--device", "cpu"])
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 2, r.stderr

    image = tmp_path / "x.png"
    cv2.imwrite(str(image), np.zeros((37, 53, 3), np.uint8))
    vit = ["--model", str(FIXTURES / "vision" / "vit"), "--device", "cpu", "--headless", "--json", "-k", "1"]
    r = runner.invoke(app, ["classify", str(image), "--max-pixels", "1000", *vit])
    assert r.exit_code == 1 and "declares 53 x 37 pixels" in r.stderr and "--max-pixels" in r.stderr
    assert r.stdout == ""
    r = runner.invoke(app, ["classify", str(image), "--max-pixels", "1961", *vit])  # 53 x 37 = 1961: at the limit
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 1, r.stderr


def test_the_pixel_limit_is_a_vision_option(tmp_path):
    from pipelines.vision import ImageClassifier, VisionOptions
    image = tmp_path / "x.png"
    cv2.imwrite(str(image), np.zeros((37, 53, 3), np.uint8))
    with ImageClassifier(str(FIXTURES / "vision" / "vit"), device="cpu", options=VisionOptions(max_pixels=1000)) as clf:
        with pytest.raises(InputError, match="declares 53 x 37 pixels"):
            clf.classify(image)
    with pytest.raises(UsageError, match="max_pixels must be a positive integer"):
        VisionOptions(max_pixels=0)
