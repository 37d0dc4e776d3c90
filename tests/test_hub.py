"""Model resolution order and the offline switch."""
from __future__ import annotations

from dataclasses import replace

import pytest

from sdk import hub
from sdk.errors import ModelNotFound
from sdk.settings import load


def settings(tmp_path, offline=True):
    return replace(load({"XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path)}), offline=offline)


def test_explicit_path_wins(tmp_path):
    assert hub.resolve(str(tmp_path), settings=settings(tmp_path)).origin == "path"
    with pytest.raises(ModelNotFound, match="does not exist"):
        hub.resolve(str(tmp_path / "nope"), settings=settings(tmp_path))


def test_installed_package_then_hf_cache(tmp_path):
    s = settings(tmp_path)
    src = hub.resolve("all-MiniLM-L6-v2", settings=s)
    assert src.origin == "package" and (src.path / "model.safetensors").exists()
    assert hub.resolve("sentence-transformers/all-MiniLM-L6-v2", settings=s).origin == "package"
    snap = s.hf_cache / "models--org--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    with pytest.raises(ModelNotFound):                 # a download cut after config.json is not a model
        hub.resolve("org/tiny", settings=s)
    (snap / "model.safetensors").write_bytes(b"")
    (s.hf_cache / "models--org--tiny" / "refs").mkdir()
    (s.hf_cache / "models--org--tiny" / "refs" / "main").write_text("abc123")
    src = hub.resolve("org/tiny", settings=s)
    assert (src.origin, src.path) == ("hf-cache", snap)


def test_offline_never_downloads_and_says_how_to_fix(tmp_path):
    with pytest.raises(ModelNotFound) as e:
        hub.resolve("org/not-cached", settings=settings(tmp_path))
    assert "offline" in str(e.value) and e.value.exit_code == 4


def test_settings_read_the_environment_in_one_place():
    s = load({"AIE_APPS_HOME": "/x/home", "HF_HUB_OFFLINE": "1", "AIE_APPS_DEVICE": "CPU"})
    assert (str(s.home), s.offline, s.device) == ("/x/home", True, "cpu")
    assert str(s.compiled_dir) == "/x/home/compiled"
    assert load({}).offline is False


@pytest.mark.parametrize("offline", [True, False])
def test_an_unknown_bare_name_is_never_offered_to_pull(tmp_path, offline):
    """`whisper-tiny` is neither a known name nor a repo id: the fix names the real ones, never a pull of it."""
    with pytest.raises(ModelNotFound) as e:
        hub.resolve("whisper-tiny", settings=settings(tmp_path, offline=offline))
    assert "models pull whisper-tiny`" not in e.value.fix and "did you mean whisper-tiny.en" in e.value.fix
    assert "unknown model" in e.value.message and "offline" not in e.value.message


@pytest.mark.parametrize("offline", [True, False])
def test_a_name_that_is_no_repo_id_is_refused_before_any_download(tmp_path, monkeypatch, offline):
    import huggingface_hub

    def download(*args, **kwargs):
        raise AssertionError("a name that is no repo id reached the download")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    for name in ("org/../../x", "a/b/c", "org/name with space"):
        with pytest.raises(ModelNotFound) as e:
            hub.resolve(name, settings=settings(tmp_path, offline=offline))
        assert "nor a Hugging Face repo id" in e.value.message and "models pull" not in e.value.fix, name


def test_an_unreachable_hub_says_so_and_how_to_go_on(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def no_connection(*args, **kwargs):  # what hf_hub_download raises once its retries found no server
        raise LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub ...")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_connection)  # download() imports it from here
    with pytest.raises(ModelNotFound) as e:
        hub.resolve("vit-base-patch16-224", settings=settings(tmp_path, offline=False))
    assert e.value.message == "could not reach https://huggingface.co to download google/vit-base-patch16-224"
    assert "models pull google/vit-base-patch16-224" in e.value.fix and "--model PATH" in e.value.fix
    assert not (tmp_path / "cache" / "huggingface" / "hub" / "models--google--vit-base-patch16-224").exists()
