"""The shadow side of a split deployment (``mirror --compare`` + ``shadow``) under faults: the
shadow killed with -9 mid-batch, then a second shadow instance joining and leaving its group
(two rebalances) while tasks run. Every entry still gets exactly one verdict."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.faults.support import (
    FaultRow,
    Share,
    SidecarProcess,
    assert_one_verdict_each,
    ready,
    wait_until,
)

pytestmark = [pytest.mark.faults, pytest.mark.timeout(420), pytest.mark.kafka39]


async def test_shadow_killed_mid_batch_and_a_second_instance_joins_and_leaves(
    share: Share, tmp_path: Path, fault_table: list[FaultRow]
) -> None:
    total = 4000
    env = share.env()
    port_a, port_b = free_port(), free_port()
    shadow_a = SidecarProcess(
        ["shadow"],
        {
            **env,
            "SIDECAR_METRICS_PORT": str(port_a),
            "SIDECAR_INSTANCE": f"shadow-a-{share.stream}",
        },
        tmp_path / "shadow-a.log",
    )
    # A replica scaled out for a while: no stable name, so it leaves the group when it stops.
    env_b = {k: v for k, v in env.items() if k != "SIDECAR_INSTANCE"}
    shadow_b = SidecarProcess(
        ["shadow"], {**env_b, "SIDECAR_METRICS_PORT": str(port_b)}, tmp_path / "shadow-b.log"
    )
    mirror = SidecarProcess(
        ["mirror", "--compare"],
        {**env, "SIDECAR_INSTANCE": f"mirror-{share.stream}"},
        tmp_path / "mirror.log",
    )
    worker = share.worker(total)
    try:
        # The shadow first: with SHADOW_START=latest it must be in place before the mirror
        # produces anything it is meant to see.
        shadow_a.start()
        await wait_until(lambda: ready(port_a), "shadow A to be ready", timeout_s=120)
        mirror.start()
        producer = share.producer(total, pause_s=0.3)
        await wait_until(share.has_verdicts, "the first verdicts", timeout_s=120)
        shadow_a.restart()  # SIGKILL with tasks in hand and offsets not committed
        await wait_until(lambda: ready(port_a), "shadow A back", timeout_s=120)
        shadow_b.start()  # joins: the group rebalances
        await wait_until(lambda: ready(port_b), "shadow B to be ready", timeout_s=120)
        await asyncio.sleep(3.0)  # B works its partitions for a while
        b_processed = await _processed(port_b)
        assert shadow_b.stop() == 0  # leaves: the group rebalances again
        left = time.monotonic()
        ids = await producer
        verdicts = await share.judged(total, timeout_s=240)
        recover_s = time.monotonic() - left
        assert mirror.stop() == 0
        assert shadow_a.stop() == 0
    finally:
        for process in (shadow_a, shadow_b, mirror):
            process.close()
    kinds = assert_one_verdict_each(verdicts, ids)
    row = await share.assert_intact(total, ids, worker, crashes=1)
    fault_table.append(
        FaultRow.of(
            "shadow kill -9 + instance joins/leaves",
            row,
            recover_s,
            f"verdicts {dict(kinds)}; B processed {b_processed} records while in",
        )
    )


async def _processed(port: int) -> int:
    """Records the shadow on ``port`` has processed, from its own metrics."""
    metrics = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in metrics.splitlines()
        if line.startswith("ragflow_sidecar_shadow_processed_total{")
    )


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return str(reply.read().decode())
