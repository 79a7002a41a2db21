"""Liveness and readiness as a supervisor reads them: ``/healthz`` answers whether the process
should be restarted (a wedged loop), ``/readyz`` whether it can work (Valkey and Kafka there)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.dev.local_stack import LocalKafka
from tests.conftest import free_port
from tests.faults.support import (
    Share,
    SidecarProcess,
    answers,
    own_settings,
    probe,
    ready,
    wait_until,
)
from tests.shadow_handlers import RELEASE
from tests.shadow_support import metered_sidecar, running_sidecar
from tests.test_shadow import enqueue

pytestmark = [pytest.mark.faults, pytest.mark.timeout(300)]

OUTAGE_S = 60


async def test_healthz_stays_200_through_a_kafka_outage_while_readyz_is_503(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    own_broker: LocalKafka,
    tmp_path: Path,
) -> None:
    own = own_settings(settings, unique, bootstrap=own_broker.bootstrap_servers)
    share = await Share.prepare(own, valkey_client, unique)
    port = free_port()
    env = share.env(
        KAFKA_REQUEST_TIMEOUT_MS="2000",
        SIDECAR_METRICS_PORT=str(port),
        SIDECAR_METRICS_HOST="127.0.0.1",
        HEALTH_WEDGED_S="10",  # far below the outage: an outage must not look like a wedge
    )
    with SidecarProcess(["run"], env, tmp_path / "sidecar.log") as sidecar:
        await wait_until(lambda: ready(port), "/readyz 200", 120, 0.5)
        await asyncio.to_thread(own_broker.stop)
        seen: dict[str, set[int | None]] = {"/healthz": set(), "/readyz": set()}
        ends = time.monotonic() + OUTAGE_S
        while time.monotonic() < ends:
            for path, codes in seen.items():
                codes.add(await probe(port, path))
            await asyncio.sleep(1)
        await asyncio.to_thread(own_broker.start)
        await wait_until(lambda: ready(port), "/readyz 200 again", 180, 1.0)
        assert await probe(port, "/healthz") == 200
        assert sidecar.stop() == 0
    assert seen["/healthz"] == {200}, seen
    assert 503 in seen["/readyz"], seen


async def test_healthz_turns_503_when_a_loop_is_wedged(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    stream, port, config = await metered_sidecar(
        settings,
        valkey_client,
        unique,
        SIDECAR_METRICS_HOST="127.0.0.1",
        SHADOW_HANDLER="tests.shadow_handlers:stall_until_released",
        MAX_CONCURRENT_TASKS="1",
        HEALTH_WEDGED_S="2",
    )
    RELEASE.clear()
    try:
        async with running_sidecar(config):
            await wait_until(lambda: ready(port), "/readyz 200", 60, 0.2)
            assert await probe(port, "/healthz") == 200
            await enqueue(valkey_client, stream, [{"id": f"{unique}{n}"} for n in range(3)])
            await wait_until(
                lambda: answers(port, "/healthz", 503), "/healthz 503 for the stalled loop", 60, 0.2
            )
            RELEASE.set()
            await wait_until(
                lambda: answers(port, "/healthz", 200),
                "/healthz 200 once the loop turns again",
                60,
                0.2,
            )
    finally:
        RELEASE.set()
