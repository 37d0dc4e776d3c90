"""Downloads for real, through `aie-apps models pull`, against a hub stand-in on 127.0.0.1 (tests/hf_server.py):
success, resume after a cut connection, a corrupted file rejected, offline refused, no empty folders left.
Each command runs in a subprocess: huggingface_hub reads HF_ENDPOINT and HF_HUB_OFFLINE when it is imported."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .conftest import FIXTURES
from .hf_server import Repo, serve

ROOT = Path(__file__).resolve().parent.parent
REPO_ID = "fixture-org/tiny-esm"


def fixture_repo(**modes) -> Repo:
    esm = FIXTURES / "esm"
    files = {name: (esm / name).read_bytes() for name in ("config.json", "model.safetensors", "vocab.txt")}
    return Repo(REPO_ID, files, lfs={"model.safetensors"}, **modes)


@pytest.fixture
def hub(tmp_path):
    """A function that starts the stand-in for a repo and returns the env that points the CLI at it."""
    servers = []

    def start(repo: Repo) -> dict:
        server, endpoint = serve(repo)
        servers.append(server)
        env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "AIE_APPS_OFFLINE")}
        env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"), XDG_CACHE_HOME=str(tmp_path / "cache"),
                   HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_XET="1", PYTHONPATH=str(ROOT))
        return env
    yield start
    for server in servers:
        server.shutdown()


def aie(env: dict, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apps.main", *args], env=env, cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=120)


def repo_folder(tmp_path) -> Path:
    return tmp_path / "hf" / "hub" / f"models--{REPO_ID.replace('/', '--')}"


def test_pull_downloads_into_the_hf_cache_and_the_model_then_runs_offline(tmp_path, hub):
    repo = fixture_repo()
    env = hub(repo)
    r = aie(env, "models", "pull", REPO_ID, "--json")
    assert r.returncode == 0, r.stderr
    pulled = json.loads(r.stdout)
    folder = Path(pulled["path"])
    assert pulled["origin"] == "download" and folder.is_relative_to(repo_folder(tmp_path))
    for name, data in repo.files.items():
        assert (folder / name).read_bytes() == data
    served = len(repo.requests)
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    r = aie(offline, "embed", "-", "--model", REPO_ID, "--device", "cpu", stdin=">p1\nMKTAYIAKQR\n")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["id"] == "p1"
    r = aie(env, "models", "pull", REPO_ID)                   # already here: nothing is fetched again
    assert r.returncode == 0 and len(repo.requests) == served


def test_a_cut_connection_resumes_from_where_it_stopped(tmp_path, hub):
    repo = fixture_repo(cut_once={"model.safetensors"})
    # huggingface_hub writes what it received in 10 MiB chunks: a cut in a bigger file leaves bytes to resume
    # from (only the transfer is tested here, the bytes need not be a loadable checkpoint).
    repo.files["model.safetensors"] = np.random.default_rng(0).bytes(24 << 20)
    env = hub(repo)
    r = aie(env, "models", "pull", REPO_ID)
    if r.returncode != 0:                                     # the cut surfaced: running again resumes
        assert "resumes" in r.stderr, r.stderr
        r = aie(env, "models", "pull", REPO_ID)
    assert r.returncode == 0, r.stderr
    assert (Path(r.stdout.strip()) / "model.safetensors").read_bytes() == repo.files["model.safetensors"]
    ranges = [rng for method, path, rng in repo.requests if method == "GET" and path.endswith("model.safetensors")]
    assert len(ranges) >= 2 and ranges[-1].startswith("bytes=") and not ranges[-1].startswith("bytes=0-"), ranges


def test_a_corrupted_file_is_rejected_and_deleted(tmp_path, hub):
    env = hub(fixture_repo(corrupt={"model.safetensors"}))
    r = aie(env, "models", "pull", REPO_ID)
    assert r.returncode == 4 and "corrupt" in r.stderr and "Traceback" not in r.stderr, r.stderr
    blobs = [p for p in repo_folder(tmp_path).rglob("*") if p.is_file() and p.stat().st_size > 10_000]
    assert blobs == []                                        # no corrupted weights kept to be loaded later
    r = aie({**env, "HF_HUB_OFFLINE": "1"}, "embed", "-", "--model", REPO_ID, "--device", "cpu", stdin=">p\nMK\n")
    assert r.returncode == 4, r.stderr                        # a folder with only config.json is not a model


def test_offline_refuses_without_a_request_and_names_only_the_switch_that_is_set(hub):
    repo = fixture_repo()
    env = {**hub(repo), "AIE_APPS_OFFLINE": "1"}
    r = aie(env, "models", "pull", REPO_ID)
    assert r.returncode == 4 and repo.requests == []
    assert "AIE_APPS_OFFLINE" in r.stderr and "HF_HUB_OFFLINE" not in r.stderr, r.stderr


def test_a_failed_download_leaves_no_empty_folders(tmp_path, hub):
    env = hub(Repo(REPO_ID, {"README.md": b"no model here"}))
    r = aie(env, "models", "pull", REPO_ID)
    assert r.returncode == 4 and "config.json" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not repo_folder(tmp_path).exists()


def test_models_lists_every_known_name_with_where_it_is_or_how_to_get_it(tmp_path):
    from apps.main import app
    from sdk import hub as sdk_hub
    from typer.testing import CliRunner
    r = CliRunner().invoke(app, ["models", "--json"])
    assert r.exit_code == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert set(rows) == set(sdk_hub.KNOWN)
    for row in rows.values():
        assert row["path"] if row["installed"] else row["get"].startswith(("pip install", "aie-apps models pull"))
