"""Valkey (AOF on) restarted under a running sidecar: it rides the restart out in-process and
loses nothing, and RAGFlow's group is as RAGFlow left it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.dev.local_stack import LocalValkey
from tests import tiers
from tests.conftest import free_port, own_valkey
from tests.faults.support import (
    FaultRow,
    Share,
    SidecarProcess,
    answers,
    assert_one_verdict_each,
    own_settings,
    probe,
    produce,
    ready,
    wait_until,
)

pytestmark = [pytest.mark.faults, pytest.mark.timeout(420)]


@pytest.fixture
@tiers.starts_servers
def aof_valkey(tmp_path: Path) -> Iterator[LocalValkey]:
    """A Valkey of this test's own, persisting to an append-only file."""
    with own_valkey(tmp_path / "valkey-aof", aof=True) as server:
        yield server


async def test_valkey_restarted_with_aof_mid_stream(
    settings: Settings,
    aof_valkey: LocalValkey,
    unique: str,
    tmp_path: Path,
    fault_table: list[FaultRow],
) -> None:
    own = own_settings(settings, unique, redis_url=aof_valkey.url)
    total = 4000
    client = avalkey.Valkey(**own.redis.client_kwargs(), decode_responses=False)
    try:
        share = await Share.prepare(own, client, unique)
        port = free_port()
        env = share.env(SIDECAR_METRICS_PORT=str(port))
        worker = share.worker(total)
        with SidecarProcess(["run"], env, tmp_path / "sidecar.log") as sidecar:
            # Half of it as a backlog, so the sidecar is busy with it when Valkey goes away.
            ids = await produce(client, unique, total // 2, chunk=500, pause_s=0.0)
            await wait_until(
                lambda: _mirrored_some(client, unique), "the mirror to start", timeout_s=120
            )
            await asyncio.to_thread(aof_valkey.stop)  # SHUTDOWN: the AOF is flushed
            # While Valkey is away the endpoint stays up across the in-process restarts and
            # says the sidecar is not ready, rather than going silent.
            await wait_until(
                lambda: answers(port, "/readyz", 503), "/readyz to answer 503", timeout_s=60
            )
            assert await probe(port, "/metrics") == 200
            await asyncio.to_thread(aof_valkey.start)
            await wait_until(lambda: ready(port), "/readyz to answer 200 again", timeout_s=120)
            restarted = time.monotonic()
            ids += await produce(client, unique, total - total // 2, pause_s=0.05)
            verdicts = await share.judged(total, timeout_s=240)
            recover_s = time.monotonic() - restarted
            assert sidecar.stop() == 0
        log = (tmp_path / "sidecar.log").read_text()
        assert "starting again in" in log  # it noticed, and restarted in-process
        kinds = assert_one_verdict_each(verdicts, ids)
        row = await share.assert_intact(total, ids, worker, crashes=1)
    finally:
        await client.aclose()
    fault_table.append(
        FaultRow.of(
            "Valkey restart (AOF) mid-stream",
            row,
            recover_s,
            f"verdicts {dict(kinds)}, in-process restarts {log.count('starting again in')}",
        )
    )


async def _mirrored_some(client: avalkey.Valkey, stream: str) -> bool:
    groups = {g["name"].decode(): g for g in await client.xinfo_groups(stream)}
    mirror = next((g for name, g in groups.items() if name.startswith("mirror-")), None)
    return mirror is not None and int(mirror.get("entries-read") or 0) > 0
