"""The shape of the code: imports follow the data, no cycle, no module past 400 lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.check_imports import build_graph, check, cycles

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 400


def test_the_tree_follows_the_flow() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tools.check_imports"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no cycle" in run.stdout


def _tree(root: Path, modules: dict[str, str]) -> Path:
    for name, source in modules.items():
        path = root / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            if str(parent) != ".":
                (root / parent / "__init__.py").touch()
        path.write_text(source)
    return root


def test_a_cycle_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "sidecar.cli.a": "from sidecar.cli import b\n",
            "sidecar.cli.b": "def f():\n    from sidecar.cli.a import x\n",
        },
    )
    assert cycles(build_graph(root)) == [["sidecar.cli.a", "sidecar.cli.b"]]
    assert check(root) == ["import cycle: sidecar.cli.a -> sidecar.cli.b"]


@pytest.mark.parametrize(
    ("source", "target", "problem"),
    [
        ("sidecar.transport.kafka", "sidecar.config", "sidecar.transport may import only"),
        ("sidecar.transport.kafka", "sidecar.telemetry.tracing", "sidecar.transport may import"),
        ("sidecar.config.model", "sidecar.mirror.mirror", "sidecar.config may import only"),
        ("sidecar.telemetry.tracing", "sidecar.verdicts.model", "sidecar.telemetry may import"),
        ("sidecar.verdicts.judge", "sidecar.shadow.shadow", "comes after sidecar.shadow"),
        ("sidecar.observer.observer", "sidecar.mirror.mirror", "comes after sidecar.mirror"),
        ("sidecar.shadow.shadow", "sidecar.cli.status", "a stage imports only later stages"),
        ("sidecar.app.service", "sidecar.dev.demo", "not in the wheel"),
        ("sidecar.errors", "sidecar.config", "the foundation imports nothing"),
        ("sidecar.wire.evidence", "sidecar.transport.kafka", "sidecar.wire may import only"),
        ("sidecar.serve.gate", "ragflow_mq.recorder", "the sidecar never imports ragflow_mq"),
        ("sidecar.transport.served", "ragflow_mq.share", "the sidecar never imports ragflow_mq"),
        ("ragflow_mq.runtime", "sidecar.telemetry.metrics", "ragflow_mq may import only"),
        ("comparators.outcome", "sidecar.errors", "comparators may import only"),
        ("ragflow_mq.runtime", "sidecar.mirror.mirror", "ragflow_mq may import only"),
    ],
)
def test_an_arrow_against_the_flow_is_found(
    tmp_path: Path, source: str, target: str, problem: str
) -> None:
    root = _tree(tmp_path, {source: f"import {target}\n", target: ""})
    problems = check(root)
    assert len(problems) == 1 and problem in problems[0], problems
    assert problems[0].startswith(f"{source} imports {target}")


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("sidecar.mirror.mirror", "sidecar.shadow.replay"),  # down the flow
        ("sidecar.shadow.shadow", "sidecar.verdicts.join"),
        ("sidecar.observer.observer", "sidecar.transport.redis_streams"),
        ("sidecar.cli.main", "sidecar.dev.commands"),
        ("sidecar.transport.served", "sidecar.wire.contract"),
        ("sidecar.serve.gate", "sidecar.wire.evidence"),
        ("ragflow_mq.recorder", "sidecar.wire.contract"),
        ("ragflow_mq.consumer", "sidecar.transport.kafka"),
    ],
)
def test_arrows_down_the_flow_pass(tmp_path: Path, source: str, target: str) -> None:
    root = _tree(tmp_path, {source: f"from {target} import thing\n", target: "thing = 1\n"})
    assert check(root) == []
    assert target in build_graph(root).edges[source]


def test_type_checking_imports_count(tmp_path: Path) -> None:
    # A cycle only the type checker walks is still found: the next refactor makes it real.
    root = _tree(
        tmp_path,
        {
            "sidecar.cli.render": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from sidecar.cli.report import Report\n"
            ),
            "sidecar.cli.report": "from sidecar.cli import render\n",
        },
    )
    assert check(root) == ["import cycle: sidecar.cli.render -> sidecar.cli.report"]


def test_what_ragflow_loads_stands_on_the_wire_layer_only() -> None:
    # ragflow_mq runs inside RAGFlow's processes: importing it must not load a sidecar room
    # above the layers it is allowed (the stages, serve, rollout, cli, app, telemetry).
    code = (
        "import sys, ragflow_mq\n"
        "low = ('sidecar.wire', 'sidecar.transport', 'sidecar.config', 'sidecar.errors',\n"
        "       'sidecar.lifecycle', 'sidecar.clock', 'sidecar.text', 'sidecar.version')\n"
        "rooms = {m for m in sys.modules if m.startswith('sidecar.')}\n"
        "above = sorted(m for m in rooms if not m.startswith(low))\n"
        "assert not above, above\n"
        "assert any(m.startswith('sidecar.wire') for m in rooms), sorted(rooms)\n"
    )
    _python(code)


def _python(code: str) -> None:
    """Run ``code`` in a fresh interpreter from the checkout; its assertions must hold."""
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr


def test_no_module_is_past_400_lines() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for package in ("sidecar", "comparators", "ragflow_mq", "dashboards", "tools", "bench")
        for path in (ROOT / package).rglob("*.py")
    }
    assert sizes, "no module found"
    too_long = {path: lines for path, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert not too_long, too_long


def test_the_public_api_loads_on_first_use() -> None:
    code = (
        "import sys, sidecar\n"
        "assert sorted(m for m in sys.modules if m.startswith('sidecar')) == ['sidecar', 'sidecar.version']\n"
        "assert set(sidecar.__all__) == {'__version__', *sidecar._EXPORTS}\n"
        "for name in sidecar.__all__:\n"
        "    assert getattr(sidecar, name) is not None, name\n"
        "assert sidecar.Settings is __import__('sidecar.config').config.Settings\n"
    )
    _python(code)
