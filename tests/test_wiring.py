"""The composition root's clients: started before the parts, stopped after them, and closed when
a start fails half-way (the supervisor then builds a new sidecar: nothing may stay connected)."""

from __future__ import annotations

import pytest

from sidecar.app.service import Sidecar
from sidecar.app.wiring import Assembly, ValkeyClient
from sidecar.config import Settings
from sidecar.errors import ServiceUnavailableError, SidecarError
from sidecar.lifecycle import Lifecycle
from sidecar.observer.observer import WorkerObserver


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
