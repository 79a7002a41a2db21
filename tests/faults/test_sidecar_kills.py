"""`ragflow-sidecar run` killed with -9 at random moments while RAGFlow works: nothing in the
share is lost, duplicates stay within one batch per crash, and no verdict is given twice."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.transport.topics import init_topics
from tests.faults.support import (
    FaultRow,
    SidecarProcess,
    acked_more,
    assert_one_verdict_each,
    assert_ragflow_untouched,
    assert_reconciled,
    judged,
    produce,
    ragflow_worker,
    sidecar_env,
    wait_until,
)
from tests.mirror_support import RAGFLOW_GROUP

pytestmark = [pytest.mark.faults, pytest.mark.timeout(420)]

BATCH = 100


async def test_kill_9_of_the_whole_sidecar_five_times(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    tmp_path: Path,
    fault_table: list[FaultRow],
) -> None:
    await init_topics(settings.kafka)
    total, kills = 5000, 5
    await valkey_client.xgroup_create(unique, RAGFLOW_GROUP, id="0", mkstream=True)
    env = sidecar_env(
        f"redis://{settings.redis.host}:{settings.redis.port}/1",
        ",".join(settings.kafka.bootstrap_servers),
        unique,
        unique,
        MIRROR_BATCH=str(BATCH),
    )
    rng = random.Random(11)
    worker = asyncio.create_task(ragflow_worker(valkey_client, unique, total))
    producer = asyncio.create_task(produce(valkey_client, unique, total, pause_s=0.25))
    with SidecarProcess(["run"], env, tmp_path / "sidecar.log") as sidecar:
        for _ in range(kills):
            # At a random moment once it is mirroring again, so that each kill hits work.
            await wait_until(
                lambda: acked_more(valkey_client, unique, f"mirror-{unique}"),
                "the mirror to ack entries again",
                timeout_s=120,
                interval_s=0.05,
            )
            await asyncio.sleep(rng.uniform(0.0, 1.5))
            sidecar.restart()  # SIGKILL mid-batch, mid-verdict, with nothing committed
        restarted = time.monotonic()
        ids = await producer
        verdicts = await judged(settings, unique, total, timeout_s=180)
        recover_s = time.monotonic() - restarted
        assert sidecar.stop() == 0
    kinds = assert_one_verdict_each(verdicts, ids)
    row = await assert_reconciled(settings, unique, total, crashes=kills, batch=BATCH)
    await assert_ragflow_untouched(valkey_client, unique, await worker, ids)
    takeovers = (tmp_path / "sidecar.log").read_text().count("took over")
    fault_table.append(
        FaultRow(
            "sidecar (run) kill -9 x5",
            total,
            len(row.missing),
            row.extra_records,
            recover_s,
            f"verdicts {dict(kinds)}, dead claims taken over {takeovers}",
        )
    )
