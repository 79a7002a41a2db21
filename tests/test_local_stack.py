"""The local stack: idempotent up, stop by pid only, Valkey with AOF survives a restart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import valkey

from sidecar.dev.local_stack import LocalStack, LocalValkey
from sidecar.dev.local_stack.kafka import DEFAULT_KAFKA_VERSION
from tests.conftest import free_port, kafka_version

pytestmark = pytest.mark.kafka39


def test_up_is_idempotent_and_exports_the_settings(stack: LocalStack) -> None:
    pids = (stack.valkey.process.pid(), stack.kafka.process.pid())
    stack.up()
    assert (stack.valkey.process.pid(), stack.kafka.process.pid()) == pids
    assert stack.exports() == (
        f"export REDIS_URL=redis://127.0.0.1:{stack.config.valkey_port}/1\n"
        f"export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:{stack.config.kafka_port}\n"
    )
    assert all(service.answering for service in stack.status())
    assert stack.kafka.running_version() == kafka_version()


@pytest.mark.servers
def test_valkey_with_aof_keeps_data_across_kill_9(tmp_path: Path) -> None:
    server = LocalValkey(tmp_path, free_port(), aof=True)
    server.start()
    try:
        with valkey.Valkey(port=server.port, db=1) as client:
            client.xadd("te.0.common", {"message": '{"id": "kept"}'})
        server.kill()
        assert not server.ping()
        server.start()
        with valkey.Valkey(port=server.port, db=1) as client:
            assert client.xlen("te.0.common") == 1
    finally:
        server.stop()


def test_down_never_signals_a_process_it_did_not_start(tmp_path: Path) -> None:
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # A pid file naming someone else's process (as after a pid is reused) is not ours.
        (tmp_path / "valkey.pid").write_text(f"{stranger.pid} 1\n")
        stopped = LocalStack.from_state(tmp_path).down()
        assert stopped == []
        assert stranger.poll() is None
        assert not (tmp_path / "valkey.pid").exists()
    finally:
        stranger.kill()
        stranger.wait()
    assert os.path.isdir(tmp_path)


def test_a_kafka_version_that_is_not_a_release_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFKA_VERSION", "4.x")
    with pytest.raises(
        ValueError, match=r"^KAFKA_VERSION: '4\.x' is not a release such as 3\.9\.1$"
    ):
        kafka_version()
    monkeypatch.setenv("KAFKA_VERSION", "")
    assert kafka_version() == DEFAULT_KAFKA_VERSION
