"""The mirror killed with -9 while tasks stream in: nothing in the share is ever lost."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import valkey.asyncio as avalkey

from sidecar.lag import stream_lag
from sidecar.settings import Settings
from sidecar.topics import init_topics
from tests.mirror_support import read_mirrored, stream_in

pytestmark = pytest.mark.faults

GROUP = "ragflow_kafka_mirror"
BATCH = 500


def start_mirror(
    settings: Settings, stream: str, name: str, log: Path, **extra: str
) -> subprocess.Popen[bytes]:
    env = {
        **{
            k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "MIRROR_", "REDIS_"))
        },
        "REDIS_URL": f"redis://{settings.redis.host}:{settings.redis.port}/1",
        "KAFKA_BOOTSTRAP_SERVERS": ",".join(settings.kafka.bootstrap_servers),
        "MIRROR_STREAMS": stream,
        "MIRROR_START": "earliest",
        "MIRROR_CONSUMER": name,
        "MIRROR_BATCH": str(BATCH),
        "MIRROR_BLOCK_MS": "200",
        "STATUS_INTERVAL_S": "2",
        **extra,
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sidecar", "mirror"], env=env, stdout=out, stderr=out
        )


async def drained(client: avalkey.Valkey, stream: str, total: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    lag = pending = None
    while time.monotonic() < deadline:
        lag = await stream_lag(client, stream, GROUP)
        if lag is not None:  # the mirror has created its group
            pending = (await client.xpending(stream, GROUP))["pending"]
            if lag == 0 and pending == 0 and await client.xlen(stream) == total:
                return
        await asyncio.sleep(0.2)
    raise AssertionError(f"not drained in {timeout_s} s: lag={lag} pending={pending}")


def stop_gracefully(process: subprocess.Popen[bytes]) -> int:
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout=30)


async def test_kill_9_five_times_while_50000_entries_stream_in(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str, tmp_path: Path
) -> None:
    await init_topics(settings.kafka)
    total, kills = 50_000, 5
    log = tmp_path / "mirror.log"
    rng = random.Random(7)
    mirror = start_mirror(settings, unique, "m1", log)
    producer = asyncio.create_task(stream_in(valkey_client, unique, total))
    try:
        for _ in range(kills):
            await asyncio.sleep(rng.uniform(0.5, 2.0))
            mirror.kill()  # SIGKILL: no flush, no ack
            mirror.wait()
            mirror = start_mirror(settings, unique, "m1", log)
        await producer
        await drained(valkey_client, unique, total, timeout_s=180)
        assert stop_gracefully(mirror) == 0
    finally:
        if mirror.poll() is None:
            mirror.kill()
            mirror.wait()
    found = await read_mirrored(settings, {unique}, total)
    counts = Counter(m.headers["x-redis-id"] for m in found)
    duplicates = sum(n - 1 for n in counts.values())
    print(f"\n{total} entries, {kills} kills: {len(counts)} in Kafka, {duplicates} duplicates")
    assert len(counts) == total  # nothing lost
    assert duplicates <= kills * BATCH  # at most the batch in hand per crash


async def test_two_instances_one_killed_the_other_takes_over(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str, tmp_path: Path
) -> None:
    await init_topics(settings.kafka)
    total = 20_000
    claim = {"MIRROR_CLAIM_IDLE_MS": "1500"}
    producer = asyncio.create_task(stream_in(valkey_client, unique, total))
    for _ in range(1000):  # the stream exists once the first chunk is in
        if await valkey_client.exists(unique):
            break
        await asyncio.sleep(0.01)
    first = start_mirror(settings, unique, "m1", tmp_path / "m1.log", **claim)
    second = start_mirror(settings, unique, "m2", tmp_path / "m2.log", **claim)
    try:
        # Kill the first instance while it holds entries read but not yet acked... or at least
        # once it has joined and read; XAUTOCLAIM must then move whatever it held.
        held = 0
        for _ in range(20_000):
            if await stream_lag(valkey_client, unique, GROUP) is not None:
                names = await valkey_client.xinfo_consumers(unique, GROUP)
                held = next((c["pending"] for c in names if c["name"] == b"m1"), 0)
                if held:
                    break
            await asyncio.sleep(0.001)
        first.kill()  # never restarted: its pending entries must move to m2
        first.wait()
        await producer
        await drained(valkey_client, unique, total, timeout_s=180)
        assert stop_gracefully(second) == 0
    finally:
        for process in (first, second):
            if process.poll() is None:
                process.kill()
                process.wait()
    print(f"\nm1 held {held} entries when killed")
    assert held, "the first instance never held entries, so nothing was taken over"
    assert "took over" in (tmp_path / "m2.log").read_text()
    found = await read_mirrored(settings, {unique}, total)
    counts = Counter(m.headers["x-redis-id"] for m in found)
    print(f"\n{total} entries, two instances, one killed: {len(counts)} in Kafka, "
          f"{sum(counts.values()) - len(counts)} duplicates")  # fmt: skip
    assert len(counts) == total
    consumers = {
        c["name"]: c["pending"] for c in await valkey_client.xinfo_consumers(unique, GROUP)
    }
    assert consumers.get(b"m1", 0) == 0
