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
    assert_one_verdict_each,
    kill_repeatedly,
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
