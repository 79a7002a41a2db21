"""The state store full (noeviction at its maxmemory) under a running sidecar: it slows down and
retries, recording nothing, judging nothing, committing and dead-lettering nothing of the tasks
it cannot record, and once there is room every entry gets exactly one final verdict."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.dev.local_stack import LocalValkey
from sidecar.verdicts.join import JOIN_PREFIX
from tests.conftest import free_port
from tests.faults.support import (
    FaultRow,
    Share,
    SidecarProcess,
    assert_one_verdict_each,
    own_settings,
    produce,
    ready,
    wait_until,
)
from tests.test_state_store import fill_until_full, keys, state_client, state_url

pytestmark = [pytest.mark.faults, pytest.mark.timeout(420)]

REFUSED = "is at its maxmemory"
_RESTART = re.compile(r"sidecar stopped: (.*); starting again in ([\d.]+) s")


def restarts(log: Path) -> list[tuple[str, float]]:
    """Each in-process restart the log tells of: its cause and the backoff before it."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return [(match[1], float(match[2])) for match in _RESTART.finditer(text)]


async def test_a_full_state_store_slows_the_sidecar_down_and_loses_no_verdict(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    state_valkey: LocalValkey,
    tmp_path: Path,
    fault_table: list[FaultRow],
) -> None:
    total = 200
    own = own_settings(settings, unique)
    share = await Share.prepare(own, valkey_client, unique)
    port = free_port()
    env = share.env(SIDECAR_STATE_URL=state_url(state_valkey), SIDECAR_METRICS_PORT=str(port))
    log = tmp_path / "sidecar.log"
    state = state_client(state_valkey)
    try:
        with SidecarProcess(["run"], env, log) as sidecar:
            await wait_until(lambda: ready(port), "the sidecar to be ready", timeout_s=120)
            # Full: noeviction (the default), a limit just above what is in use, filled up to
            # it; then a margin below, so that a key expiring meanwhile lets no write through.
            used = int((await state.info("memory"))["used_memory"])
            await state.config_set("maxmemory", used + 256 * 1024)
            await fill_until_full(state)
            await state.config_set("maxmemory", used + 128 * 1024)
            worker = share.worker(total)
            ids = await produce(valkey_client, unique, total, pause_s=0.0)
            before = len(restarts(log))

            async def refused_with_tasks_in_hand() -> bool:
                refused = [cause for cause, _ in restarts(log)[before:] if REFUSED in cause]
                pending = await valkey_client.xpending(unique, share.mirror_group)
                return len(refused) >= 2 and pending["pending"] > 0

            await wait_until(
                refused_with_tasks_in_hand, "the state store to refuse the sidecar", 180, 0.5
            )
            # Slowing down: each refusal waits longer before the next try.
            backoffs = [backoff for cause, backoff in restarts(log) if REFUSED in cause]
            assert backoffs == sorted(backoffs) and backoffs[-1] > backoffs[0], backoffs
            # Nothing of these tasks was recorded or judged: the mirror holds them unacked.
            assert await keys(state, f"{JOIN_PREFIX}{unique}:*") == []
            assert not await share.has_verdicts()

            await state.config_set("maxmemory", used + 256 * 1024 * 1024)  # room again
            raised = time.monotonic()
            verdicts = await share.judged(total, timeout_s=240)
            recover_s = time.monotonic() - raised
            assert sidecar.stop() == 0
        kinds = assert_one_verdict_each(verdicts, ids)
        crashes = len(restarts(log))
        row = await share.assert_intact(total, ids, worker, crashes=crashes)
        assert row.dead_lettered == 0
        assert int((await state.info("stats"))["evicted_keys"]) == 0
    finally:
        await state.aclose()
    fault_table.append(
        FaultRow.of(
            "State store full (noeviction)",
            row,
            recover_s,
            f"verdicts {dict(kinds)}, in-process restarts {crashes}, backoffs {backoffs}",
        )
    )
