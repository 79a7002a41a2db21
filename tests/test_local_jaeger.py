"""The local stack's Jaeger: started from the shipped config, idempotent, stopped by pid, and
named in the stack's exports and status when asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.dev.local_stack import LocalStack, StackConfig
from sidecar.dev.local_stack.jaeger import CONFIG_FILE, JaegerPorts, LocalJaeger, jaeger_binary
from sidecar.errors import LocalStackError
from tests.conftest import free_port


def test_start_finds_the_running_one(jaeger: LocalJaeger) -> None:
    """The session's Jaeger, seen through a second handle on its directory: start() finds it
    running (same pid), and its query API answers with no services before any span."""
    again = LocalJaeger(jaeger.root, jaeger.ports)
    pid = jaeger.process.pid()
    assert pid is not None
    again.start()
    assert again.process.pid() == pid and again.answers()
    assert isinstance(again.get("/api/services")["data"], list | None)


@pytest.mark.servers
def test_a_jaeger_of_its_own_stops_and_leaves_nothing_listening(tmp_path: Path) -> None:
    server = LocalJaeger(tmp_path, JaegerPorts(*(free_port() for _ in range(5))))
    server.start()
    assert server.answers()
    assert server.stop()
    assert not server.answers() and server.process.pid() is None
    assert not server.stop()  # not running: nothing to signal


def test_the_stack_exports_the_traces_endpoint_only_with_jaeger(tmp_path: Path) -> None:
    plain = LocalStack(StackConfig(root=tmp_path))
    assert plain.jaeger is None and "OTEL_" not in plain.exports()
    # Free ports: status() asks each service, and nothing of a developer's must answer.
    traced = LocalStack(
        StackConfig(
            tmp_path, free_port(), free_port(), free_port(), jaeger=True, jaeger_otlp_port=24999
        )
    )
    assert traced.jaeger is not None
    assert traced.exports().endswith(
        "export OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:24999\n"
    )
    [status] = [s for s in traced.status() if s.name == "jaeger"]
    assert status.pid is None and not status.answering


def test_a_missing_binary_is_named_with_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAEGER", str(tmp_path / "no-jaeger"))
    with pytest.raises(LocalStackError, match="make jaeger"):
        jaeger_binary()
    assert CONFIG_FILE.is_file()
