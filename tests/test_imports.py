"""Data flows one way: models -> graph -> compiler -> program -> runtime -> session -> pipelines -> apps.
A module may import only from its own layer or layers below it; importing never touches hardware."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Lower number = lower layer. The first matching prefix decides.
LAYERS = [
    ("sdk.ops", 0), ("sdk.errors", 0), ("sdk.settings", 0), ("sdk.weights", 0), ("sdk.hub", 0),
    ("sdk.atomic", 0), ("sdk.vocab", 0),
    ("sdk.graph", 1), ("sdk.program", 1),
    ("sdk.models", 2),
    ("sdk.compiler", 3),
    ("sdk.runtime", 4),
    ("sdk.session", 5),
    ("sdk", 5),  # the package facade (lazy re-exports only)
    ("pipelines", 6),
    ("apps", 7),
]


def layer(module: str) -> int | None:
    for prefix, rank in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path):
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for a in node.names:  # `from pkg import submodule` imports the submodule, not the package facade
                sub = f"{target}.{a.name}"
                is_module = (ROOT / sub.replace(".", "/")).with_suffix(".py").exists() or (ROOT / sub.replace(".", "/")).is_dir()
                yield sub if is_module else target


def test_nothing_imports_upward():
    bad = []
    for top in ("sdk", "pipelines", "apps"):
        for path in (ROOT / top).rglob("*.py"):
            mine = layer(module_name(path))
            for target in imports(path):
                theirs = layer(target)
                if theirs is not None and mine is not None and theirs > mine:
                    bad.append(f"{module_name(path)} imports {target}")
    assert not bad, "upward imports:\n" + "\n".join(sorted(set(bad)))


def test_importing_the_sdk_touches_no_hardware_and_no_torch():
    code = ("import sys, sdk, sdk.session, sdk.runtime, sdk.compiler, pipelines.text, apps.main; "
            "bad = [m for m in ('pyxrt', 'torch', 'transformers', 'aie') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# The runtime runs a Program without the compiler, and each backend stands alone: a backend's modules are the
# backend's own file and the files named after it (npu_lock.py, npu_artifacts.py, emu_numerics.py, ...). Shared
# runtime code (arena, packing, backend, checks) belongs to no backend.
BACKENDS = {"cpu": ("sdk.runtime.cpu",), "emu": ("sdk.runtime.emu",),
            "npu": ("sdk.runtime.npu",)}


def backend_of(module: str) -> str | None:
    for backend, owned in BACKENDS.items():
        if any(module == m or module.startswith(m + "_") or module.startswith(m + ".") for m in owned):
            return backend
    return None


def runtime_imports():
    for path in (ROOT / "sdk" / "runtime").rglob("*.py"):
        for target in imports(path):
            yield module_name(path), target


def test_the_runtime_never_imports_the_compiler():
    bad = sorted({f"{m} imports {t}" for m, t in runtime_imports() if layer(t) == layer("sdk.compiler")})
    assert not bad, "runtime -> compiler imports:\n" + "\n".join(bad)


def test_no_backend_imports_another_backend():
    bad = sorted({f"{m} imports {t}" for m, t in runtime_imports()
                  if backend_of(m) and backend_of(t) and backend_of(m) != backend_of(t)})
    assert not bad, "backend -> backend imports:\n" + "\n".join(bad)


def test_the_rules_see_the_imports_they_forbid():
    """The two checks above classify real module names as they should (else they could pass vacuously)."""
    assert layer("sdk.compiler.layout") == layer("sdk.compiler") != layer("sdk.runtime.emu")
    assert [backend_of(m) for m in ("sdk.runtime.npu_lock", "sdk.runtime.npu", "sdk.runtime.emu",
                                    "sdk.runtime.emu_numerics", "sdk.runtime.cpu", "sdk.runtime.arena",
                                    "sdk.runtime.packing")] == ["npu", "npu", "emu", "emu", "cpu", None, None]
    found = dict(runtime_imports())
    assert found and set(found) >= {"sdk.runtime.npu", "sdk.runtime.emu", "sdk.runtime.arena"}
    assert "sdk.runtime.arena" in {t for m, t in runtime_imports() if m == "sdk.runtime.emu"}
