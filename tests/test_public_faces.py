"""Each room's public face: its ``__init__`` exports, in ``__all__``, every name another room
imports from it, and nothing it does not define. Read from the source with :mod:`ast`, as
tools/check_imports.py reads it, imports under ``TYPE_CHECKING`` and inside functions
included."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sidecar", "comparators", "ragflow_mq")
# Rooms whose face is not kept here: the lead's (ragflow_mq's __init__ is what RAGFlow loads,
# sidecar.wire is the layer both packages stand on).
NO_FACE = ("ragflow_mq", "sidecar.wire")
# Names other rooms may still import from the module itself, and why they are not exported.
DEEP: dict[tuple[str, str], str] = {
    ("sidecar.cli.main", "main"): "the entry point; exported, it would hide sidecar.cli.main",
    ("sidecar.serve.gate", "render_json"): "gate's and share's render_json share one name",
    ("sidecar.serve.share", "render_json"): "gate's and share's render_json share one name",
}
# Modules other rooms may still import from, and why their names are not exported.
DEEP_MODULES: dict[str, str] = {
    **dict.fromkeys(
        (
            "sidecar.transport.coalesce",
            "sidecar.transport.lag",
            "sidecar.transport.served",
            "sidecar.transport.topic_reader",
        ),
        "ragflow_mq does not load it: exported by transport, it would load in RAGFlow's processes",
    ),
    "sidecar.telemetry.semconv": "the span attributes' vocabulary, read as the conventions",
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _rooms() -> list[str]:
    """The packages other code imports from: ``comparators`` and each subpackage of
    ``sidecar`` (a single module such as ``sidecar.errors`` is its own face)."""
    found = ["comparators"]
    found += [_module(p.parent) for p in sorted((ROOT / "sidecar").glob("*/__init__.py"))]
    return [room for room in found if room not in NO_FACE]


def _room_of(module: str, rooms: list[str]) -> str | None:
    return next((r for r in rooms if module == r or module.startswith(r + ".")), None)


def _imports() -> Iterator[tuple[str, str, str]]:
    """(importing module, module imported from, name) for every ``from … import`` of the
    packages."""
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    for alias in node.names:
                        yield _module(path), node.module, alias.name


def _is_submodule(module: str, name: str) -> bool:
    return (ROOT / Path(*module.split("."), name)).with_suffix(".py").is_file() or (
        ROOT / Path(*module.split("."), name, "__init__.py")
    ).is_file()


@pytest.mark.parametrize("room", _rooms())
def test_each_name_a_room_exports_is_the_one_its_module_defines(room: str) -> None:
    package = importlib.import_module(room)
    exported = getattr(package, "__all__", None)
    assert exported, f"{room}/__init__.py has no __all__"
    assert len(exported) == len(set(exported)), f"{room}: a name twice in __all__"
    missing = [name for name in exported if not hasattr(package, name)]
    assert not missing, f"{room}.__all__ names what it does not define: {missing}"


def test_every_name_another_room_imports_is_in_that_rooms_face() -> None:
    rooms = _rooms()
    exports = {room: set(importlib.import_module(room).__all__) for room in rooms}
    deep_used: set[tuple[str, str]] = set()
    unexported: list[str] = []
    for importer, module, name in _imports():
        room = _room_of(module, rooms)
        if room is None or _room_of(importer, rooms) == room or _is_submodule(module, name):
            continue
        if (module, name) in DEEP or module in DEEP_MODULES:
            deep_used.add((module, name) if (module, name) in DEEP else (module, ""))
            continue
        if name not in exports[room]:
            unexported.append(f"{importer}: from {module} import {name}")
        else:
            # The room's name is the module's object, not another of the same name.
            exported = getattr(importlib.import_module(room), name)
            assert exported is getattr(importlib.import_module(module), name), (room, name)
    assert not unexported, (
        "imported across rooms but not in the room's __all__ (export it, or list it in DEEP "
        "with why):\n" + "\n".join(sorted(set(unexported)))
    )
    # The allowances are all still needed.
    assert {key for key in DEEP} <= deep_used, set(DEEP) - deep_used
    assert set(DEEP_MODULES) <= {module for module, _ in deep_used}


def test_the_modules_kept_deep_for_ragflow_are_the_ones_it_does_not_load() -> None:
    """transport's face leaves out what ragflow_mq does not load (tests/test_architecture.py
    holds it to the layers below the stages); once it loads one, export it instead."""
    code = (
        "import sys, ragflow_mq\nprint(' '.join(m for m in sys.modules if m.startswith('sidecar')))"
    )
    out = subprocess.check_output([sys.executable, "-c", code], cwd=ROOT, text=True, timeout=120)
    loaded = set(out.split())
    assert "sidecar.transport" in loaded
    kept = {m for m, why in DEEP_MODULES.items() if why.startswith("ragflow_mq does not load")}
    assert kept and not loaded & kept, sorted(loaded & kept)
