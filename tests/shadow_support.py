"""Shared pieces for the shadow tests: a sidecar on a test's own streams, and its verdicts."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import valkey.asyncio as avalkey

from sidecar.app.service import Sidecar
from sidecar.config import Settings
from sidecar.mirror.mirror import RecordTransform
from sidecar.transport import KafkaConsumer
from sidecar.transport.topics import VERDICTS_TOPIC
from sidecar.verdicts.model import parse_verdict
from tests.conftest import free_port
from tests.mirror_support import prepare_stream


def sidecar_settings(base: Settings, streams: list[str], unique: str, **extra: str) -> Settings:
    return Settings.from_env(
        {
            "REDIS_URL": f"redis://{base.redis.host}:{base.redis.port}/1",
            "KAFKA_BOOTSTRAP_SERVERS": ",".join(base.kafka.bootstrap_servers),
            "KAFKA_LINGER_MS": "1",
            "MIRROR_STREAMS": ",".join(streams),
            "MIRROR_PRIORITY_STREAMS": streams[0],
            "MIRROR_START": "earliest",
            "MIRROR_BLOCK_MS": "100",
            "MIRROR_GROUP": f"mirror-{unique}",
            "SHADOW_GROUP": f"shadow-{unique}",
            # The task topics are shared by the whole session: only what comes after us.
            "SHADOW_START": "latest",
            "SHADOW_COMPARE_TIMEOUT_S": "3",
            "SHADOW_RETRY_BACKOFF_MS": "10",
            "OBSERVER_INTERVAL_MS": "100",
            "SIDECAR_INSTANCE": f"sidecar-{unique}",
            "SIDECAR_METRICS_PORT": "0",
            **extra,
        }
    )


async def metered_sidecar(
    base: Settings, client: avalkey.Valkey, unique: str, **extra: str
) -> tuple[str, int, Settings]:
    """A stream of the test's own with RAGFlow's group (``prepare_stream``), and settings for a
    sidecar on it whose metrics endpoint has a free port: the stream, the port, the settings."""
    stream = f"{unique}.0"
    await prepare_stream(base, client, stream)
    port = free_port()
    return (
        stream,
        port,
        sidecar_settings(base, [stream], unique, SIDECAR_METRICS_PORT=str(port), **extra),
    )


@contextlib.asynccontextmanager
async def running_sidecar(
    settings: Settings, transform: RecordTransform | None = None
) -> AsyncIterator[Sidecar]:
    """A started sidecar whose loops run until the block ends (then a graceful stop)."""
    stop = asyncio.Event()
    async with Sidecar(settings, transform=transform) as sidecar:
        assert sidecar.shadow is not None
        await sidecar.shadow.wait_ready()
        loops = asyncio.create_task(sidecar.run(stop))
        try:
            yield sidecar
        finally:
            stop.set()
            await asyncio.wait_for(loops, timeout=60)


async def read_verdicts(
    settings: Settings, streams: set[str], expected: int, timeout_s: float = 60.0
) -> list[dict[str, Any]]:
    """Every verdict about ``streams``, waiting until at least ``expected`` arrived."""
    found: list[dict[str, Any]] = []
    group = f"verdicts-{uuid.uuid4().hex[:8]}"
    async with KafkaConsumer(settings.kafka, [VERDICTS_TOPIC], group) as consumer:
        deadline = time.monotonic() + timeout_s
        quiet = 0
        while time.monotonic() < deadline:
            batch = await consumer.poll_batch(5000, 300)
            for message in batch:
                record = parse_verdict(message.value or b"")
                if record["stream"] in streams:
                    found.append(record)
            quiet = 0 if batch else quiet + 1
            # Past the expected count, read on briefly: a verdict published twice must show.
            if len(found) >= expected and quiet >= 3:
                break
    return found
