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
from sidecar.transport.topics import init_topics
from tests.faults.support import SidecarProcess, probe, ready, sidecar_env, wait_until
from tests.mirror_support import RAGFLOW_GROUP
from tests.shadow_handlers import RELEASE
from tests.shadow_support import running_sidecar, sidecar_settings
from tests.test_metrics import free_port
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
    redis_url = f"redis://{settings.redis.host}:{settings.redis.port}/1"
    own = Settings.from_env(
        {"REDIS_URL": redis_url, "KAFKA_BOOTSTRAP_SERVERS": own_broker.bootstrap_servers}
    )
    await init_topics(own.kafka)
    await valkey_client.xgroup_create(unique, RAGFLOW_GROUP, id="0", mkstream=True)
    port = free_port()
    env = sidecar_env(
        redis_url,
        own_broker.bootstrap_servers,
        unique,
        unique,
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
    await init_topics(settings.kafka)
    stream = f"{unique}.0"
    await valkey_client.xgroup_create(stream, RAGFLOW_GROUP, id="0", mkstream=True)
    port = free_port()
    config = sidecar_settings(
        settings,
        [stream],
        unique,
        SIDECAR_METRICS_PORT=str(port),
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

            async def wedged() -> bool:
                return await probe(port, "/healthz") == 503

            await wait_until(wedged, "/healthz 503 for the stalled loop", 60, 0.2)
            RELEASE.set()

            async def alive() -> bool:
                return await probe(port, "/healthz") == 200

            await wait_until(alive, "/healthz 200 once the loop turns again", 60, 0.2)
    finally:
        RELEASE.set()
