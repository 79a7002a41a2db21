"""The autopilot end to end: RAGFlow-like API and executors through ``install()``, the whole
sidecar judging the Redis path, and ``ragflow-sidecar rollout run`` stepping the live share by
the gate's decisions (a plan scaled down: steps of seconds, tens of tasks)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import valkey.asyncio as avalkey

from sidecar.dev.local_stack import LocalStack
from sidecar.rollout.machine import RolloutState
from sidecar.rollout.store import RolloutKeys
from sidecar.serve.share import read_status, set_share
from sidecar.transport.topics import init_topics
from tests.ragflow_support import assert_exactly_once, pending_count, read_produced, wait_until
from tests.serve_support import by_path, make_world

pytestmark = pytest.mark.timeout(600)

PLAN = {
    "ROLLOUT_STEPS": "10,50,100",
    "ROLLOUT_DWELL_S": "3",
    "ROLLOUT_MIN_TASKS": "20",
    "ROLLOUT_INTERVAL_S": "1",
    "ROLLOUT_LEASE_S": "5",
    "GATE_MIN_SAMPLE": "20",
}


@pytest.mark.parametrize("kafka_failures", [0, 5])
async def test_the_autopilot_ramps_a_clean_shift_and_rolls_back_a_failing_one(
    stack: LocalStack,
    unique: str,
    tmp_path: Path,
    valkey_client: avalkey.Valkey,
    kafka_failures: int,
) -> None:
    """Clean: the plan is climbed to 100 % and the autopilot watches. With 5 % of the Kafka
    path's tasks failing: it rolls the share back to 0 by itself. Either way every task runs
    exactly once, and RAGFlow's processes were never restarted."""
    world = await make_world(
        stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100",
        STANDIN_FAIL_KAFKA_PERCENT=str(kafka_failures), SERVE_SHARE_REFRESH_S="0.5",
    )  # fmt: skip
    settings = world.settings(**PLAN)
    await init_topics(settings.kafka)  # the verdicts topic the gate reads
    await set_share(settings, 0.0, by="test", reason="the runbook's first step")
    keys = RolloutKeys(unique)

    async def state() -> RolloutState | None:
        raw = await valkey_client.get(keys.state)
        return RolloutState.from_json(raw) if raw else None

    async def phase_is(*phases: str) -> bool:
        current = await state()
        return current is not None and current.phase in phases

    env = {**os.environ, **world.env, **PLAN}
    with (
        world.sidecar(tmp_path / "sidecar.log"),
        world.executor("task_executor_common_r_0"),
        world.executor("task_executor_common_r_1"),
    ):
        await world.wait_members(2)
        api, out = world.api("produced.jsonl", docs=6000, tasks_per_doc=1, rate=60)
        with api, _autopilot(env, tmp_path / "rollout.log") as pilot:
            started = time.monotonic()
            wanted = ("watching",) if kafka_failures == 0 else ("rolled_back",)
            await wait_until(lambda: phase_is(*wanted), 300, interval_s=1.0, what=str(wanted))
            took_s = time.monotonic() - started
            api.terminate()
        assert pilot.returncode == 0, (tmp_path / "rollout.log").read_text()
        produced = read_produced(out)
        ids = {str(p["task_id"]) for p in produced}
        await world.wait_executed(valkey_client, ids, timeout_s=180)

        async def settled() -> bool:
            pending = await pending_count(valkey_client, world.streams, "rag_flow_svr_task_broker")
            return pending == 0 and await world.kafka_settled()

        await wait_until(settled, 120, interval_s=0.5, what="both paths settled")
    records = await world.executed(valkey_client)
    assert_exactly_once(ids, records)
    final = await state()
    assert final is not None
    live = (await read_status(settings)).values.live
    log = await _decisions(valkey_client, keys)
    actions = [d["action"] for d in log]
    print(
        f"failures {kafka_failures} %: {final.phase} at {final.share:g} % after {took_s:.0f} s, "
        f"{len(ids)} tasks {dict(by_path(records))}; decisions "
        f"{[a for a in actions if a != 'hold']}"
    )
    if kafka_failures == 0:
        assert (final.phase, final.share, live) == ("watching", 100.0, 100.0)
        assert [a for a in actions if a != "hold"] == ["start", "promote", "promote", "promote"]
    else:
        assert (final.phase, final.share, live) == ("rolled_back", 0.0, 0.0)
        rollback = next(d for d in log if d["action"] == "rollback")
        assert "kafka fails more than redis" in rollback["reason"], rollback


async def _decisions(client: avalkey.Valkey, keys: RolloutKeys) -> list[dict[str, str]]:
    entries = await client.xrange(keys.log)
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


class _autopilot:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self._env, self._log = env, log
        self.returncode: int | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> _autopilot:
        with open(self._log, "wb") as out:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "sidecar", "rollout", "run"],
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None
        self._process.terminate()
        self.returncode = self._process.wait(60)
