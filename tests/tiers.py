"""The suite's two tiers: tests that need a server, and `make check`'s, which need none.

A test is marked ``servers`` when its fixture closure holds a fixture decorated
``@tiers.starts_servers`` (the session's stack, which ``settings`` and everything on it reach; a
broker or Valkey of the test's own; the fault suite's cluster; a module's fixture that runs Helm
or docker-compose), or by hand (``@pytest.mark.servers``) when the test starts one itself.
`make check` runs ``-m "not servers"``. Marking by the closure means a new test that asks for
Valkey or Kafka lands in the slow tier without anyone remembering to mark it; for one that
starts a server without such a fixture, the guard below fails it, in any run, rather than let
`make check` quietly start servers (and grow slow) or pass on a machine that happens to have
them. The package index counts as a server: `make check` runs offline.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from typing import Any, TypeVar

import pytest

MARK = "servers"
_STARTS_SERVERS = "_tiers_starts_servers"
# Programs that are servers, or that only a server's test runs: Valkey and Kafka (Java, and
# Maven fetching its jars), Helm, Prometheus and promtool, docker-compose, Jaeger.
SERVER_PROGRAMS = frozenset(
    {"valkey-server", "java", "mvn", "helm", "prometheus", "promtool", "docker-compose"}
    | {"jaeger", "jaeger-all-in-one"}
)


_FETCHES = (["install"], ["wheel"], ["download"])
F = TypeVar("F", bound=Callable[..., object])


class UnmarkedServerTest(RuntimeError):
    """A test not marked ``servers`` started a server program."""


def starts_servers(fixture: F) -> F:
    """Under ``@pytest.fixture``: every test whose closure holds this fixture is marked
    ``servers`` (the mark is read from the function, so the fixture's name does not matter)."""
    setattr(fixture, _STARTS_SERVERS, True)
    return fixture


def uses_server_fixture(item: pytest.Item) -> bool:
    # _fixtureinfo is how pytest itself knows the closure's definitions; the last definition of
    # a name is the one the test gets (a module's fixture over conftest's).
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        getattr(definitions[-1].func, _STARTS_SERVERS, False)
        for name in info.names_closure
        if (definitions := info.name2fixturedefs.get(name))
    )


def needs_servers(items: Iterable[pytest.Item]) -> bool:
    return any(item.get_closest_marker(MARK) for item in items)


def program_of(executable: object, args: object) -> str:
    """The server program a ``subprocess.Popen`` audit event starts, or ``""``: a server's
    binary, or the sidecar's ``local-stack up`` / ``demo`` (whose servers are the child's, out
    of this process's sight)."""
    if not isinstance(executable, (str, bytes, os.PathLike)):
        return ""
    name = Path(os.fsdecode(executable)).name
    if name in SERVER_PROGRAMS:
        return name
    if not isinstance(args, (list, tuple)):
        return ""
    words = [os.fsdecode(arg) for arg in args if isinstance(arg, (str, bytes, os.PathLike))]
    for n, word in enumerate(words):
        # `python -m sidecar ...` or the `ragflow-sidecar` script.
        if word == "sidecar" or Path(word).name == "ragflow-sidecar":
            rest = words[n + 1 : n + 3]
            if rest[:1] == ["demo"] or rest == ["local-stack", "up"]:
                return " ".join(["ragflow-sidecar", *rest])
        # `python -m pip install|wheel|download`: the package index (build isolation fetches
        # setuptools even for --no-deps).
        if word == "pip" and words[n - 1 : n] == ["-m"] and words[n + 1 : n + 2] in _FETCHES:
            return "pip (the package index)"
    return ""


class Tiers:
    """The pytest plugin: marks the server tests, and refuses a server to an unmarked one."""

    def __init__(self) -> None:
        self.running: pytest.Item | None = None
        # An audit hook cannot be removed, so it is added once per process and reads
        # ``running``, which is set only while a test (setup, call, teardown) runs.
        sys.addaudithook(self._audit)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        # tryfirst: before ``-m`` deselects by the marks (pytest's own hook runs later).
        for item in items:
            if uses_server_fixture(item):
                item.add_marker(MARK)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        self.running = item
        try:
            return (yield)
        finally:
            self.running = None

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event != "subprocess.Popen" or self.running is None:
            return
        program = program_of(args[0], args[1])
        if program and not self.running.get_closest_marker(MARK):
            raise UnmarkedServerTest(
                f"{self.running.nodeid} starts {program} but is not marked {MARK!r}: mark it "
                f"@pytest.mark.{MARK}, or take the server from a conftest fixture "
                "(tests/tiers.py), so that `make check` stays server-free"
            )


def register(config: pytest.Config) -> None:
    config.pluginmanager.register(Tiers(), "tiers")
