"""The composition root's clients: started before the parts, stopped after them, and closed when
a start fails half-way (the supervisor then builds a new sidecar: nothing may stay connected)."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.app.service import Sidecar
from sidecar.app.wiring import Assembly, ValkeyClient
from sidecar.config import Settings
from sidecar.errors import ServiceUnavailableError, SidecarError
from sidecar.lifecycle import Lifecycle
from sidecar.observer.observer import WorkerObserver
from tests.conftest import free_port


class Part(Lifecycle):
    """Records its starts and stops in ``log``; fails to start or stop when told to."""

    def __init__(self, name: str, log: list[str], *, fail_start: bool = False) -> None:
        super().__init__()
        self.name, self.log, self.fail_start, self.fail_stop = name, log, fail_start, False

    async def _start(self) -> None:
        if self.fail_start:
            raise ServiceUnavailableError(f"{self.name} is away")
        self.log.append(f"start {self.name}")

    async def _stop(self) -> None:
        self.log.append(f"stop {self.name}")
        if self.fail_stop:
            raise SidecarError(f"{self.name} did not stop")


async def test_parts_start_in_order_and_stop_in_reverse_even_past_a_failed_stop() -> None:
    log: list[str] = []
    client, part = Part("client", log), Part("part", log)
    assembly = Assembly((client, None, part))
    await assembly.start()
    client.fail_stop = True
    with pytest.raises(SidecarError, match="client did not stop"):
        await assembly.stop()
    assert log == ["start client", "start part", "stop part", "stop client"]
    assert not client.started and not part.started


async def test_a_failed_start_stops_what_it_started_and_nothing_else() -> None:
    log: list[str] = []
    parts = (Part("client", log), Part("part", log, fail_start=True), Part("later", log))
    with pytest.raises(ServiceUnavailableError):
        await Assembly(parts).start()
    assert log == ["start client", "stop client"]
    assert not any(part.started for part in parts)


async def test_a_sidecar_that_fails_to_start_leaves_no_client_open(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def away(self: WorkerObserver) -> None:
        raise ServiceUnavailableError("Valkey went away")

    monkeypatch.setattr(WorkerObserver, "_start", away)
    sidecar = Sidecar(settings, mirror=False, shadow=False)
    parts = sidecar._parts.parts
    clients = [part for part in parts if isinstance(part, ValkeyClient)]
    assert len(clients) == 2  # the join's and the observer's
    with pytest.raises(ServiceUnavailableError):
        await sidecar.start()
    assert not sidecar.started
    assert not any(part.started for part in parts)
    for client in clients:  # closed: none of their connections is left connected
        pool = client.client.connection_pool
        assert not any(c.is_connected for c in pool._available_connections)
        assert not pool._in_use_connections


async def test_the_state_store_and_ragflows_valkey_each_get_their_users(
    settings: Settings,
) -> None:
    """With SIDECAR_STATE_URL apart: the join, dedup and liveness keys go to the state store,
    and the served share's evidence is read there (RAGFlow's processes write it beside their
    claims); the cancel keys are read from RAGFlow's Valkey; and the readiness probe asks both
    (a state store that does not answer makes /readyz say so)."""
    nowhere = free_port()
    apart = Settings.from_env(
        {
            "REDIS_URL": f"redis://127.0.0.1:{settings.redis.port}/1",
            "SIDECAR_STATE_URL": f"redis://127.0.0.1:{nowhere}/0",
            "KAFKA_BOOTSTRAP_SERVERS": ",".join(settings.kafka.bootstrap_servers),
            "SIDECAR_METRICS_PORT": "0",
        }
    )
    sidecar = Sidecar(apart)
    state, ragflow = sidecar.state_client, sidecar.ragflow_client

    def where(client: Any) -> tuple[int, int]:
        kwargs = client.connection_pool.connection_kwargs
        return int(kwargs["port"]), int(kwargs["db"])

    assert where(state) == (nowhere, 0)
    assert where(ragflow) == (settings.redis.port, 1)
    assert sidecar.judge.join._client is state
    assert sidecar.judge.where == f"redis://127.0.0.1:{nowhere}/0"
    assert sidecar.shadow is not None
    assert sidecar.shadow._client is state  # its cancel keys: test_state_store.py
    assert sidecar._control._client is ragflow  # the redis run's cancel keys
    assert sidecar.served._given_client is state
    assert sidecar.observer is not None and where(sidecar.observer.client) == where(ragflow)
    valkeys = [part for part in sidecar._parts.parts if isinstance(part, ValkeyClient)]
    assert len(valkeys) == 4  # the state store's, RAGFlow's, the mirror's, the observer's

    try:
        await sidecar._check_dependencies()
        assert set(sidecar.health.unreachable) == {"state store"}
        assert not sidecar.health.ready
    finally:
        await state.aclose()
        await ragflow.aclose()

    together = Sidecar(settings, mirror=False, observer=False)
    assert together.state_client is together.ragflow_client  # one client, as before
    assert sum(isinstance(part, ValkeyClient) for part in together._parts.parts) == 1
