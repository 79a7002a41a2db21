"""The mirror killed with -9 while tasks stream in, alone or beside a second instance that must
take over what the dead one held: nothing in the share is lost."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import valkey.asyncio as avalkey

from sidecar.transport.lag import stream_lag
from tests.faults.support import FaultRow, Share, SidecarProcess, kill_repeatedly, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.timeout(420)]

BATCH = 500
CLAIM_IDLE_MS = 1500


def mirror_env(share: Share, name: str, **extra: str) -> dict[str, str]:
    return share.env(MIRROR_CONSUMER=name, MIRROR_BATCH=str(BATCH), **extra)


async def drained(client: avalkey.Valkey, stream: str, group: str, total: int) -> bool:
    """The mirror's group has read and acked every one of ``total`` entries."""
    lag = await stream_lag(client, stream, group)
    if lag != 0 or await client.xlen(stream) != total:
        return False
    return bool((await client.xpending(stream, group))["pending"] == 0)


async def test_kill_9_five_times_while_50000_entries_stream_in(
    share: Share, tmp_path: Path, fault_table: list[FaultRow]
) -> None:
    total, kills = 50_000, 5
    rng = random.Random(7)
    worker = share.worker(total, timeout_s=400)
    producer = share.producer(total, chunk=1000, pause_s=0.05)
    env = mirror_env(share, "m1")
    with SidecarProcess(["mirror"], env, tmp_path / "mirror.log") as mirror:
        await kill_repeatedly(mirror, share, kills, rng, max_pause_s=1.0)
        restarted = time.monotonic()
        ids = await producer
        await wait_until(
            lambda: drained(share.client, share.stream, share.mirror_group, total),
            "the mirror to drain the stream",
            timeout_s=180,
            interval_s=0.2,
        )
        recover_s = time.monotonic() - restarted
        assert mirror.stop() == 0
    row = await share.assert_intact(total, ids, worker, crashes=kills, batch=BATCH)
    fault_table.append(FaultRow.of("mirror kill -9 x5", row, recover_s))


async def test_two_instances_one_killed_the_other_takes_over(
    share: Share, tmp_path: Path, fault_table: list[FaultRow]
) -> None:
    total = 20_000
    client, stream, group = share.client, share.stream, share.mirror_group
    worker = share.worker(total, timeout_s=400)
    producer = share.producer(total, chunk=1000, pause_s=0.05)
    claim = {"MIRROR_CLAIM_IDLE_MS": str(CLAIM_IDLE_MS)}
    with (
        SidecarProcess(["mirror"], mirror_env(share, "m1", **claim), tmp_path / "m1.log") as first,
        SidecarProcess(["mirror"], mirror_env(share, "m2", **claim), tmp_path / "m2.log") as second,
    ):
        held = 0

        async def first_holds_entries() -> bool:
            nonlocal held
            if await stream_lag(client, stream, group) is None:
                return False  # the group is not there yet
            consumers = await client.xinfo_consumers(stream, group)
            held = next((c["pending"] for c in consumers if c["name"] == b"m1"), 0)
            return held >= 100  # a real batch in hand, not a stray entry

        await wait_until(first_holds_entries, "m1 to hold a batch", timeout_s=120, interval_s=0.001)
        first.kill()  # never restarted: its pending entries must move to m2
        killed = time.monotonic()

        async def taken_over() -> bool:
            consumers = await client.xinfo_consumers(stream, group)
            return next((c["pending"] for c in consumers if c["name"] == b"m1"), 0) == 0

        takeover_s = await wait_until(taken_over, "m2 to take over", timeout_s=120, interval_s=0.05)
        ids = await producer
        await wait_until(
            lambda: drained(client, stream, group, total),
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
    row = await share.assert_intact(total, ids, worker, crashes=1, batch=BATCH)
    fault_table.append(
        FaultRow.of(
            "two mirrors, one kill -9",
            row,
            recover_s,
            f"m1 held {held}; taken over in {takeover_s:.1f} s (idle {CLAIM_IDLE_MS} ms)",
        )
    )
