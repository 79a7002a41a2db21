"""ragflow_mq under RAGFlow's pins: the constraints tool, the requirements RAGFlow's image
installs (resolved for Python 3.13 against the registry), and what ragflow_mq loads.

``make test`` also runs the ragflow_mq tests in a virtualenv built with RAGFlow's versions
(Makefile, ``pytest-ragflow-pins``); these tests run in both.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.metadata
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import valkey
from packaging.requirements import Requirement

import ragflow_mq.runtime
import sidecar.transport.valkey_client
from ragflow_mq.runtime import PATCHED, Runtime
from sidecar.config import Settings
from sidecar.dev.local_stack import LocalStack
from tests import tiers
from tests.test_compose import _declared_closure, _normalise
from tools.check_imports import build_graph
from tools.ragflow_constraints import (
    DEFAULT_OUTPUT,
    ConstraintsError,
    main,
    mismatches,
    read_constraints,
    read_lock,
    render,
)

pytestmark = pytest.mark.ragflow_pins

REPO = Path(__file__).resolve().parent.parent
SIDECAR_ONLY = ("opentelemetry", "deepdiff", "numpy", "scipy", "prometheus_client", "grpc")

LOCK = """\
version = 1
requires-python = "==3.13.*"

[[package]]
name = "ragflow"
version = "0.27.0"
source = { virtual = "." }

[[package]]
name = "Valkey"
version = "6.0.2"
source = { registry = "https://example.invalid/simple" }

[[package]]
name = "typing_extensions"
version = "4.15.0"
source = { registry = "https://example.invalid/simple" }

[[package]]
name = "graspologic"
version = "3.4.1"
source = { git = "https://example.invalid/graspologic.git?rev=38e6#38e6" }
"""


def test_the_tool_pins_the_index_packages_and_names_the_rest() -> None:
    lock = read_lock(LOCK)
    assert lock.pins == {"typing-extensions": "4.15.0", "valkey": "6.0.2"}
    assert lock.unpinned == ("graspologic", "ragflow")
    text = render(lock, "infiniflow/ragflow uv.lock at abc123")
    assert "# source: infiniflow/ragflow uv.lock at abc123" in text
    assert "ragflow 0.27.0; requires-python: ==3.13.*" in text
    assert read_constraints(text) == lock.pins


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not = [toml", "not TOML"),
        ("version = 1\n", "no [[package]]"),
        (LOCK + '[[package]]\nname = "valkey"\nversion = "6.1.0"\nsource = { registry = "x" }\n',
         "valkey at 6.0.2 and 6.1.0"),
    ],
)  # fmt: skip
def test_a_lock_the_tool_cannot_use_is_refused_saying_why(text: str, problem: str) -> None:
    with pytest.raises(ConstraintsError, match=re.escape(problem)):
        read_lock(text)


def test_generate_from_a_clone_records_the_commit(tmp_path: Path) -> None:
    clone = tmp_path / "ragflow"
    clone.mkdir()
    (clone / "uv.lock").write_text(LOCK)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    for args in (["init", "-q"], ["add", "uv.lock"], ["commit", "-q", "-m", "lock"]):
        subprocess.run(["git", *args], cwd=clone, env=env, check=True, capture_output=True)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=clone, check=True, capture_output=True, text=True
    ).stdout.strip()
    output = tmp_path / "constraints.txt"
    assert main(["generate", "--git-dir", str(clone / ".git"), "--output", str(output)]) == 0
    text = output.read_text()
    assert f"uv.lock at {commit} (" in text and "valkey==6.0.2" in text
    assert main(["generate", "--git-dir", str(clone / ".git"), "--rev", "nope"]) == 2


def test_verify_names_each_package_at_another_version() -> None:
    pins = {"valkey": "6.0.2", "orjson": "3.11.9"}
    assert mismatches(pins, {"valkey": "6.2.0", "orjson": "3.11.9"}) == [
        "valkey: installed 6.2.0, RAGFlow pins 6.0.2"
    ]
    with pytest.raises(ConstraintsError, match="line 2: expected name==version"):
        read_constraints("valkey==6.0.2\nvalkey>=6.1\n")


def test_verify_checks_the_installed_packages_a_freeze_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    installed = importlib.metadata.version("valkey")
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(f"valkey==0.0.1\npyyaml=={importlib.metadata.version('PyYAML')}\n")
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("PyYAML==6.0\n-e file:///somewhere\n")
    assert main(["verify", "--only", str(freeze), str(constraints)]) == 0
    freeze.write_text("valkey==6.0.2\nPyYAML==6.0\n")
    assert main(["verify", "--only", str(freeze), str(constraints)]) == 1
    assert f"valkey: installed {installed}, RAGFlow pins 0.0.1" in capsys.readouterr().err


def _committed() -> dict[str, str]:
    return read_constraints(DEFAULT_OUTPUT.read_text(encoding="utf-8"))


def test_the_committed_constraints_name_the_ragflow_commit_they_come_from() -> None:
    header = [line for line in DEFAULT_OUTPUT.read_text().splitlines() if line.startswith("#")]
    source = next(line for line in header if line.startswith("# source: "))
    assert source.startswith("# source: infiniflow/ragflow uv.lock at "), source
    commit = source.split(" at ")[1].split()[0]
    assert len(commit) == 40 and int(commit, 16) >= 0, commit
    assert {"valkey", "orjson", "pyyaml", "cramjam"} <= set(_committed())


def test_our_requirements_admit_every_version_ragflow_pins() -> None:
    """pyproject's floors against RAGFlow's pins, offline: the requirements RAGFlow's image
    installs (no extra; the sidecar's extra never meets RAGFlow's pins)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = _committed()
    refused = []
    for text in project["dependencies"]:
        requirement = Requirement(text)
        pin = pins.get(_normalise(requirement.name))
        if pin is not None and not requirement.specifier.contains(pin, prereleases=True):
            refused.append(f"{text} refuses RAGFlow's {pin}")
    assert not refused, refused


def _import_tops(path: Path) -> set[str]:
    tops = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            tops.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.split(".")[0])
    return tops


def test_what_ragflow_mq_imports_comes_with_the_install_ragflow_gets() -> None:
    """Every third-party import of ragflow_mq and of the project modules it reaches is owned
    by a distribution the plain install brings, never the sidecar extra."""
    graph = build_graph(REPO)
    todo = [m for m in graph.edges if m.split(".")[0] == "ragflow_mq"]
    reached: set[str] = set()
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(graph.edges.get(module, ()))
    closure = _declared_closure(frozenset())
    assert not {_normalise(n) for n in SIDECAR_ONLY} & closure
    owners = {top: _normalise(dist) for top, dists in
              importlib.metadata.packages_distributions().items() for dist in dists}  # fmt: skip
    outside = set()
    for module in reached:
        base = REPO / module.replace(".", "/")
        path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        for top in _import_tops(path):
            if top in sys.stdlib_module_names or top in ("sidecar", "ragflow_mq", "comparators"):
                continue
            if owners.get(top) not in closure:
                outside.add(f"{module} imports {top} ({owners.get(top)})")
    assert not outside, sorted(outside)


def test_ragflow_mq_loads_no_deprecated_api_and_nothing_of_the_sidecar_extra() -> None:
    """Import every ragflow_mq module and install() with DeprecationWarning an error: what
    Python 3.13 removed (PEP 594's modules, typing.io, ...) warns on 3.11 first."""
    probe = (
        "import importlib, pkgutil, sys, ragflow_mq\n"
        "for m in pkgutil.iter_modules(ragflow_mq.__path__, 'ragflow_mq.'):\n"
        "    importlib.import_module(m.name)\n"
        "from sidecar.config import Settings\n"
        "assert ragflow_mq.install(Settings.from_env({'MQ_BACKEND': 'split'}))\n"
        "ragflow_mq.uninstall()\n"
        "print(' '.join(sorted({n.split('.')[0] for n in sys.modules})))\n"
    )
    run = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-W",
         "error::PendingDeprecationWarning", "-c", probe],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    loaded = set(run.stdout.split())
    assert {"ragflow_mq", "aiokafka", "valkey"} <= loaded
    assert not loaded & set(SIDECAR_ONLY), loaded & set(SIDECAR_ONLY)


def test_libvalkey_comes_with_the_sidecars_extra_only() -> None:
    """Installed, libvalkey becomes valkey-py's reply parser for every connection of the
    process: RAGFlow's own too, had the plain install brought it."""
    assert "libvalkey" not in _declared_closure(frozenset())
    assert "libvalkey" in _declared_closure(frozenset({"sidecar"}))


def test_ragflow_mq_without_libvalkey_leaves_valkey_pys_parser_and_still_works(
    stack: LocalStack, unique: str
) -> None:
    """As in RAGFlow's environment (no libvalkey): install() loads, valkey-py keeps its own
    parser, and the state store's clients (ours, C packing off) and RAGFlow's work."""
    probe = (
        "import sys, asyncio\n"
        "sys.modules['libvalkey'] = None  # as not installed\n"
        "import valkey, valkey.utils, ragflow_mq\n"
        "from sidecar.config import Settings\n"
        "from sidecar.transport.valkey_client import create_client\n"
        "assert not valkey.utils.LIBVALKEY_AVAILABLE\n"
        f"settings = Settings.from_env({{'MQ_BACKEND': 'split', 'REDIS_URL': {stack.valkey.url!r}}})\n"
        "assert ragflow_mq.install(settings)\n"
        "async def roundtrip():\n"
        "    client = create_client(settings.state)\n"
        f"    await client.set({unique!r}, b'x' * 3)\n"
        f"    value = await client.get({unique!r})\n"
        f"    await client.delete({unique!r})\n"
        "    await client.aclose()\n"
        "    return value, client.connection_pool.connection_class.__name__\n"
        "value, connection = asyncio.run(roundtrip())\n"
        "assert value == b'xxx', value\n"
        f"ragflows = valkey.Valkey.from_url({stack.valkey.url!r})\n"
        "assert ragflows.ping()\n"
        "parser = ragflows.connection_pool.get_connection('PING')._parser\n"
        "ragflow_mq.uninstall()\n"
        "print(connection, type(parser).__name__, 'libvalkey' in {n.split('.')[0] for n in sys.modules if sys.modules[n] is not None})\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120,
        check=False, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    connection, parser, loaded = run.stdout.split()
    assert connection == "Connection", connection  # valkey-py's own, not the C-packing one
    assert parser == "_RESP2Parser", parser
    assert loaded == "False"


def test_the_sidecar_command_without_its_extra_names_what_to_install() -> None:
    """The plain wheel (RAGFlow's image) puts ragflow-sidecar on PATH too: without the extra it
    exits 2 naming it, instead of a traceback on the first missing import."""
    hide = (
        "import importlib.abc, sys\n"
        "class Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('deepdiff', 'scipy'):\n"
        "            raise ModuleNotFoundError(name=name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "from sidecar.cli.main import main\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", hide], capture_output=True, text=True, cwd=REPO, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)}, check=False,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "deepdiff, scipy not installed" in run.stderr, run.stderr
    assert "pip install 'ragflow-kafka-sidecar[sidecar]'" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.fixture
def silent_valkey() -> Iterator[str]:
    """A Valkey that stopped answering: the kernel completes each connection (the listen
    backlog), nothing ever reads or replies."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"


async def test_ragflow_mqs_valkey_clients_give_up_on_a_silent_server(
    silent_valkey: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """valkey-py before 6.1 (RAGFlow's 6.0.2) waits for a reply for ever unless told a socket
    timeout: the state store's two clients, async (claims) and sync (share, evidence), must
    fail instead of holding RAGFlow's thread. A short timeout keeps the test fast."""
    for module in (sidecar.transport.valkey_client, ragflow_mq.runtime):
        monkeypatch.setattr(module, "SOCKET_TIMEOUT_S", 0.5)
    settings = Settings.from_env(
        {"MQ_BACKEND": "split", "REDIS_URL": "redis://127.0.0.1:1/0",
         "SIDECAR_STATE_URL": silent_valkey}
    )  # fmt: skip
    runtime = Runtime(settings, SimpleNamespace(**{name: print for name in PATCHED}))
    outcome: list[BaseException] = []

    def sync_ping() -> None:
        try:
            runtime.sync_store().ping()
        except BaseException as exc:
            outcome.append(exc)

    started = time.monotonic()
    # A thread of its own, daemonic: without a timeout the ping never returns.
    thread = threading.Thread(target=sync_ping, daemon=True)
    thread.start()
    thread.join(5)
    assert outcome and isinstance(outcome[0], valkey.exceptions.TimeoutError), outcome
    store = runtime.store()
    with pytest.raises(valkey.exceptions.TimeoutError):
        await asyncio.wait_for(store.ping(), 5)
    assert time.monotonic() - started < 3
    await store.aclose()
    runtime.close()


# -- the install RAGFlow's image makes, resolved against the registry -----------------------


@pytest.fixture(scope="module")
@tiers.starts_servers
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel compose/ragflow-mq.Dockerfile installs (its wheel stage: pip wheel --no-deps)."""
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out),
         str(REPO)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    [built] = out.glob("ragflow_kafka_sidecar-*.whl")
    return built


# RAGFlow's images: Python 3.13 on x86_64 and arm64 Linux (glibc); and this interpreter.
TARGETS = {
    "py3.13-x86_64": ["3.13", "x86_64"],
    "py3.13-aarch64": ["3.13", "aarch64"],
    "this-python": [],
}


def _dry_run(
    tmp_path: Path, target: list[str], *requirements: str
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
               "--report", str(tmp_path / "report.json"), "--constraint", str(DEFAULT_OUTPUT)]  # fmt: skip
    if target:
        version, arch = target
        platforms = [f"manylinux_2_{glibc}_{arch}" for glibc in (17, 28, 34)]
        command += ["--python-version", version, "--only-binary=:all:", "--target",
                    str(tmp_path / "target"), *(f"--platform={p}" for p in platforms)]  # fmt: skip
    return subprocess.run(
        [*command, *requirements], capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.parametrize("target", TARGETS.values(), ids=TARGETS.keys())
def test_the_ragflow_images_install_moves_no_pinned_version(
    tmp_path: Path, wheel: Path, target: list[str]
) -> None:
    """The Dockerfile's install (the wheel, no extra, RAGFlow's versions as constraints) as a
    dry run from nothing: it resolves, every package RAGFlow pins stays at its pin, and what
    it adds is only the plain install's."""
    run = _dry_run(tmp_path, target, str(wheel))
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    chosen = {
        _normalise(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]
    }
    pins = _committed()
    moved = {
        name: (v, pins[name]) for name, v in chosen.items() if name in pins and v != pins[name]
    }
    assert not moved, moved
    assert chosen["valkey"] == pins["valkey"]
    added = set(chosen) - set(pins) - {"ragflow-kafka-sidecar"}
    assert not added & {_normalise(n) for n in SIDECAR_ONLY}, added
    assert "aiokafka" in added, added
    # valkey-py would take it as the parser of every one of RAGFlow's connections.
    assert "libvalkey" not in added, added


def test_a_requirement_that_would_move_a_pin_fails_the_resolution(
    tmp_path: Path, wheel: Path
) -> None:
    """The check above catches a conflict: this project's old floor, valkey>=6.1."""
    run = _dry_run(tmp_path, TARGETS["py3.13-x86_64"], str(wheel), "valkey>=6.1")
    assert run.returncode != 0
    assert "valkey" in run.stderr and "conflict" in run.stderr.lower(), run.stderr
