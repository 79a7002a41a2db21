"""The mirror killed with -9 while tasks stream in, alone or beside a second instance that must
take over what the dead one held: nothing in the share is lost."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.transport.lag import stream_lag
from sidecar.transport.topics import init_topics
from tests.faults.support import (
    FaultRow,
    SidecarProcess,
    acked_more,
    assert_ragflow_untouched,
    assert_reconciled,
    produce,
    ragflow_worker,
    sidecar_env,
    wait_until,
)
from tests.mirror_support import RAGFLOW_GROUP

pytestmark = [pytest.mark.faults, pytest.mark.timeout(420)]

BATCH = 500
CLAIM_IDLE_MS = 1500


def mirror_env(settings: Settings, stream: str, name: str, **extra: str) -> dict[str, str]:
    return sidecar_env(
        f"redis://{settings.redis.host}:{settings.redis.port}/1",
        ",".join(settings.kafka.bootstrap_servers),
        stream,
        stream,
        MIRROR_CONSUMER=name,
        MIRROR_BATCH=str(BATCH),
        **extra,
    )


async def drained(client: avalkey.Valkey, stream: str, group: str, total: int) -> bool:
    """The mirror's group has read and acked every one of ``total`` entries."""
    lag = await stream_lag(client, stream, group)
    if lag != 0 or await client.xlen(stream) != total:
        return False
    return bool((await client.xpending(stream, group))["pending"] == 0)


async def test_kill_9_five_times_while_50000_entries_stream_in(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    tmp_path: Path,
    fault_table: list[FaultRow],
) -> None:
    await init_topics(settings.kafka)
    total, kills = 50_000, 5
    await valkey_client.xgroup_create(unique, RAGFLOW_GROUP, id="0", mkstream=True)
    rng = random.Random(7)
    worker = asyncio.create_task(ragflow_worker(valkey_client, unique, total, timeout_s=400))
    producer = asyncio.create_task(produce(valkey_client, unique, total, chunk=1000, pause_s=0.05))
    env = mirror_env(settings, unique, "m1")
    with SidecarProcess(["mirror"], env, tmp_path / "mirror.log") as mirror:
        for _ in range(kills):
            # Killed at a random moment once it is mirroring again, so each kill hits work.
            await wait_until(
                lambda: acked_more(valkey_client, unique, f"mirror-{unique}"),
                "the mirror to ack entries again",
                timeout_s=120,
                interval_s=0.05,
            )
            await asyncio.sleep(rng.uniform(0.0, 1.0))
            mirror.restart()
        restarted = time.monotonic()
        ids = await producer
        await wait_until(
            lambda: drained(valkey_client, unique, f"mirror-{unique}", total),
            "the mirror to drain the stream",
            timeout_s=180,
            interval_s=0.2,
        )
        recover_s = time.monotonic() - restarted
        assert mirror.stop() == 0
    row = await assert_reconciled(settings, unique, total, crashes=kills, batch=BATCH)
    await assert_ragflow_untouched(valkey_client, unique, await worker, ids)
    fault_table.append(
        FaultRow("mirror kill -9 x5", total, len(row.missing), row.extra_records, recover_s)
    )


async def test_two_instances_one_killed_the_other_takes_over(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    tmp_path: Path,
    fault_table: list[FaultRow],
) -> None:
    await init_topics(settings.kafka)
    total = 20_000
    group = f"mirror-{unique}"
    await valkey_client.xgroup_create(unique, RAGFLOW_GROUP, id="0", mkstream=True)
    worker = asyncio.create_task(ragflow_worker(valkey_client, unique, total, timeout_s=400))
    producer = asyncio.create_task(produce(valkey_client, unique, total, chunk=1000, pause_s=0.05))
    claim = {"MIRROR_CLAIM_IDLE_MS": str(CLAIM_IDLE_MS)}
    with (
        SidecarProcess(
            ["mirror"], mirror_env(settings, unique, "m1", **claim), tmp_path / "m1.log"
        ) as first,
        SidecarProcess(
            ["mirror"], mirror_env(settings, unique, "m2", **claim), tmp_path / "m2.log"
        ) as second,
    ):
        held = 0

        async def first_holds_entries() -> bool:
            nonlocal held
            if await stream_lag(valkey_client, unique, group) is None:
                return False  # the group is not there yet
            consumers = await valkey_client.xinfo_consumers(unique, group)
            held = next((c["pending"] for c in consumers if c["name"] == b"m1"), 0)
            return held >= 100  # a real batch in hand, not a stray entry

        await wait_until(first_holds_entries, "m1 to hold a batch", timeout_s=120, interval_s=0.001)
        first.kill()  # never restarted: its pending entries must move to m2
        killed = time.monotonic()

        async def taken_over() -> bool:
            consumers = await valkey_client.xinfo_consumers(unique, group)
            return next((c["pending"] for c in consumers if c["name"] == b"m1"), 0) == 0

        takeover_s = await wait_until(taken_over, "m2 to take over", timeout_s=120, interval_s=0.05)
        ids = await producer
        await wait_until(
            lambda: drained(valkey_client, unique, group, total),
            "the stream to be drained",
            timeout_s=180,
            interval_s=0.2,
        )
        recover_s = time.monotonic() - killed
        assert second.stop() == 0
    assert "took over" in (tmp_path / "m2.log").read_text()
    # XAUTOCLAIM moves entries idle for CLAIM_IDLE_MS; m2 looks between its own batches, so
    # the takeover comes within the idle time plus the time to mirror a batch or two.
    print(f"\nm1 held {held} entries when killed; m2 had them all {takeover_s:.1f} s later")
    assert takeover_s < CLAIM_IDLE_MS / 1000 + 30
    row = await assert_reconciled(settings, unique, total, crashes=1, batch=BATCH)
    await assert_ragflow_untouched(valkey_client, unique, await worker, ids)
    fault_table.append(
        FaultRow(
            "two mirrors, one kill -9",
            total,
            len(row.missing),
            row.extra_records,
            recover_s,
            f"m1 held {held}; taken over in {takeover_s:.1f} s (idle {CLAIM_IDLE_MS} ms)",
        )
    )
