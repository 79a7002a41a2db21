"""`ragflow-sidecar run` killed with -9 while tasks stream in: no verdict lost, none repeated
beyond the one window the design admits (between Kafka's ack of a verdict and marking it)."""

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
from typing import Any

import pytest
import valkey.asyncio as avalkey

from sidecar.settings import Settings
from sidecar.topics import init_topics
from tests.mirror_support import RAGFLOW_GROUP, group_state, ragflow_worker, stream_in
from tests.shadow_support import read_verdicts

pytestmark = pytest.mark.faults


async def verdicts_for_every_entry(
    settings: Settings, stream: str, total: int, timeout_s: float
) -> list[dict[str, Any]]:
    """All verdicts about ``stream``, once every one of its ``total`` entries has a final one."""
    deadline = time.monotonic() + timeout_s
    while True:
        verdicts = await read_verdicts(settings, {stream}, expected=total, timeout_s=10)
        finals = {v["entry_id"] for v in verdicts if v["verdict"] != "duplicate"}
        if len(finals) >= total or time.monotonic() > deadline:
            return verdicts


def start_sidecar(
    settings: Settings, stream: str, unique: str, log: Path
) -> subprocess.Popen[bytes]:
    prefixes = ("KAFKA_", "MIRROR_", "REDIS_", "SHADOW_", "SIDECAR_")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(prefixes)},
        "REDIS_URL": f"redis://{settings.redis.host}:{settings.redis.port}/1",
        "KAFKA_BOOTSTRAP_SERVERS": ",".join(settings.kafka.bootstrap_servers),
        "KAFKA_REQUEST_TIMEOUT_MS": "5000",
        "MIRROR_STREAMS": stream,
        "MIRROR_START": "earliest",
        "MIRROR_GROUP": f"mirror-{unique}",
        "MIRROR_BATCH": "100",
        "MIRROR_BLOCK_MS": "200",
        "MIRROR_CLAIM_IDLE_MS": "2000",
        "SHADOW_GROUP": f"shadow-{unique}",
        "SHADOW_START": "latest",
        "SHADOW_COMPARE_TIMEOUT_S": "20",
        "OBSERVER_INTERVAL_MS": "200",
        "STATUS_INTERVAL_S": "5",
        # A stable name, as a deployment gives it: the restarted shadow rejoins its group as
        # the same static member instead of waiting out the dead one's session.
        "SIDECAR_INSTANCE": f"sidecar-{unique}",
        # The mirror's own pending entries are replayed first only under the same consumer
        # name; a new name leaves them to XAUTOCLAIM after the idle time, out of key order.
        "MIRROR_CONSUMER": f"mirror-{unique}",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sidecar", "run"], env=env, stdout=out, stderr=out
        )


async def test_kill_9_of_the_whole_sidecar_loses_no_verdict(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str, tmp_path: Path
) -> None:
    await init_topics(settings.kafka)
    total, kills = 3000, 3
    await valkey_client.xgroup_create(unique, RAGFLOW_GROUP, id="0", mkstream=True)
    log = tmp_path / "sidecar.log"
    rng = random.Random(11)
    sidecar = start_sidecar(settings, unique, unique, log)
    worker = asyncio.create_task(ragflow_worker(valkey_client, unique, total))
    producer = asyncio.create_task(stream_in(valkey_client, unique, total, chunk=100, pause_s=0.3))
    try:
        for _ in range(kills):
            await asyncio.sleep(rng.uniform(2.0, 4.0))
            sidecar.kill()  # SIGKILL: mid-batch, mid-verdict, no commit
            sidecar.wait()
            sidecar = start_sidecar(settings, unique, unique, log)
        await producer
        verdicts = await verdicts_for_every_entry(settings, unique, total, timeout_s=150)
        sidecar.send_signal(signal.SIGTERM)
        assert sidecar.wait(timeout=60) == 0
    finally:
        if sidecar.poll() is None:
            sidecar.kill()
            sidecar.wait()
    handled = await worker
    finals = [v for v in verdicts if v["verdict"] != "duplicate"]
    per_entry = Counter(v["entry_id"] for v in finals)
    kinds = Counter(v["verdict"] for v in finals)
    repeated = sum(n - 1 for n in per_entry.values())
    duplicates = sum(1 for v in verdicts if v["verdict"] == "duplicate")
    takeovers = log.read_text().count("took over")
    print(
        f"\n{total} entries, {kills} kills of `run`: {len(per_entry)} with a verdict, "
        f"kinds {dict(kinds)}, final verdicts repeated {repeated}, duplicate verdicts "
        f"{duplicates} (Kafka copies from mirror replays), sweeps taking over dead claims "
        f"{takeovers}"
    )
    assert len(per_entry) == total  # no verdict lost
    odd = [(v["differences"], v["comparators"]) for v in finals if v["verdict"] != "match"][:3]
    assert set(kinds) == {"match"}, odd
    assert repeated == 0  # a dead claimer's published verdicts are found, not repeated
    assert len(handled) == total
    state = await group_state(valkey_client, unique, RAGFLOW_GROUP)
    assert state["pending"] == []
