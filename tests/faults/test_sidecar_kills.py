"""`ragflow-sidecar run` killed with -9 at random moments while RAGFlow works: nothing in the
share is lost, duplicates stay within one batch per crash, and no verdict is given twice."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from tests.faults.support import (
    FaultRow,
    Share,
    SidecarProcess,
    acked_more,
    assert_one_verdict_each,
    kill_repeatedly,
    wait_until,
)

pytestmark = [pytest.mark.faults, pytest.mark.timeout(420)]


async def test_kill_9_of_the_whole_sidecar_five_times(
    share: Share, tmp_path: Path, fault_table: list[FaultRow]
) -> None:
    total, kills = 5000, 5
    env = share.env()
    rng = random.Random(11)
    worker = share.worker(total)
    producer = share.producer(total, pause_s=0.25)
    with SidecarProcess(["run"], env, tmp_path / "sidecar.log") as sidecar:
        # SIGKILL mid-batch, mid-verdict, with nothing committed.
        await kill_repeatedly(sidecar, share, kills, rng, max_pause_s=1.5)
        restarted = time.monotonic()
        ids = await producer
        verdicts = await share.judged(total, timeout_s=180)
        recover_s = time.monotonic() - restarted
        assert sidecar.stop() == 0
    kinds = assert_one_verdict_each(verdicts, ids)
    row = await share.assert_intact(total, ids, worker, crashes=kills)
    takeovers = (tmp_path / "sidecar.log").read_text().count("took over")
    fault_table.append(
        FaultRow.of(
            "sidecar (run) kill -9 x5",
            row,
            recover_s,
            f"verdicts {dict(kinds)}, dead claims taken over {takeovers}",
        )
    )


async def test_two_replicas_one_killed_and_replaced_under_a_new_name(
    share: Share, tmp_path: Path, fault_table: list[FaultRow]
) -> None:
    """Two replicas of `run` as a Deployment runs them (distinct stable names); one is killed
    -9 and a rescheduled pod takes its place under a new name. Every task gets one verdict,
    and no false `order` mismatch comes of two mirrors sharing a stream (or of the dead one's
    entries taken over). The verdicts' stall after the kill goes to the fault table: the
    shadow's session timeout (SHADOW_SESSION_TIMEOUT_MS, 30 s) plus a rebalance."""
    total = 3000

    def replica(name: str) -> dict[str, str]:
        return share.env(
            SIDECAR_INSTANCE=f"sidecar-{share.stream}-{name}",
            MIRROR_CONSUMER=f"mirror-{share.stream}-{name}",
        )

    worker = share.worker(total)
    # About 30 s of RAGFlow enqueueing, so that the kill and the replacement fall inside it.
    producer = share.producer(total, chunk=100, pause_s=1.0)
    # The pod that comes later: closed (killed if still running) whatever happens.
    replacement = SidecarProcess(["run"], replica("c"), tmp_path / "c.log")
    with (
        SidecarProcess(["run"], replica("a"), tmp_path / "a.log") as first,
        SidecarProcess(["run"], replica("b"), tmp_path / "b.log") as second,
    ):
        try:
            # A crash of a replica in a settled group: both hold partitions (a kill during the
            # group's first rebalance waits out the dead member twice, 60 s in one run).
            async def both_assigned() -> bool:
                logs = (tmp_path / "a.log", tmp_path / "b.log")
                return all("assigned" in log.read_text(errors="replace") for log in logs)

            await wait_until(both_assigned, "both replicas to hold partitions", timeout_s=120)
            await wait_until(share.has_verdicts, "the first verdicts", timeout_s=120)
            await wait_until(
                lambda: acked_more(share.client, share.stream, share.mirror_group),
                "the mirrors to ack entries",
                timeout_s=60,
                interval_s=0.05,
            )
            first.kill()
            killed_ms = int(time.time() * 1000)
            replacement.start()  # a new pod, a new name
            ids = await producer
            verdicts = await share.judged(total, timeout_s=240)
            assert second.stop() == 0
            assert replacement.stop() == 0
        finally:
            replacement.close()
    kinds = assert_one_verdict_each(verdicts, ids)
    row = await share.assert_intact(total, ids, worker, crashes=1)
    # The killed replica's partitions: those it decided verdicts on before the kill. Verdicts
    # resume on each when another replica first decides one there after the kill.
    killed = f"sidecar-{share.stream}-a"
    orphaned = {
        (v["topic"], v["partition"])
        for v in verdicts
        if v["sidecar"] == killed and int(v["decided_at_ms"]) < killed_ms
    }
    first_after: dict[tuple[str, int], int] = {}
    for v in verdicts:
        at, place = int(v["decided_at_ms"]), (v["topic"], v["partition"])
        if at >= killed_ms and place in orphaned:
            first_after[place] = min(at, first_after.get(place, at))
    resumed = first_after
    resume_s = max((at - killed_ms for at in resumed.values()), default=0) / 1000
    after = sorted(
        int(v["decided_at_ms"]) for v in verdicts if int(v["decided_at_ms"]) >= killed_ms
    )
    stall_s = max(b - a for a, b in zip([killed_ms, *after], after, strict=False)) / 1000
    fault_table.append(
        FaultRow.of(
            "two run replicas, one kill -9, replaced under a new name",
            row,
            resume_s,
            f"the killed replica's {len(orphaned)} partitions resumed after {resume_s:.1f} s at "
            f"most; longest pause between any verdicts {stall_s:.1f} s; verdicts {dict(kinds)}",
        )
    )
    print(
        f"\nthe killed replica's {len(orphaned)} partitions: verdicts resumed after "
        f"{resume_s:.1f} s at most ({len(resumed)} had entries after the kill); longest pause "
        f"between any two verdicts after the kill {stall_s:.1f} s"
    )
