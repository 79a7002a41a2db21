"""One autopilot run on a served-share world: RAGFlow-like API and executors through
``install()``, the whole sidecar judging the Redis path, and ``ragflow-sidecar rollout run``
stepping the live share until it watches at the last step or rolls back. Used by the tests and
by ``make demo`` (tools/shift_demo.py)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import valkey.asyncio as avalkey

from sidecar.rollout.machine import RolloutState
from sidecar.rollout.store import RolloutKeys
from sidecar.serve.share import read_status, set_share
from sidecar.transport.topics import init_topics
from tests.ragflow_support import pending_count, read_produced, wait_until
from tests.serve_support import ServeWorld

__all__ = ["SCALED_PLAN", "RolloutRun", "run_rollout", "start_autopilot"]

# The default plan's shape on a scale of seconds and tens of tasks.
SCALED_PLAN = {
    "ROLLOUT_STEPS": "10,50,100",
    "ROLLOUT_DWELL_S": "3",
    "ROLLOUT_MIN_DOCUMENTS": "20",
    "ROLLOUT_INTERVAL_S": "1",
    "ROLLOUT_LEASE_S": "5",
    "GATE_MIN_DOCUMENTS": "20",
    "GATE_MIN_VERDICTS": "20",
}


@dataclass
class RolloutRun:
    """How a run ended, how long it took, and what every task did."""

    state: RolloutState | None
    live: float | None
    seconds: float
    decisions: list[dict[str, str]]
    task_ids: set[str]
    records: list[dict[str, Any]]
    produced: list[dict[str, Any]] = field(default_factory=list)  # the API's lines
    # Seconds from the start to the Kafka path's fault (``fault_from``), if it began.
    fault_s: float | None = None
    per_task: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.per_task = Counter(str(r["task_id"]) for r in self.records)

    @property
    def lost(self) -> int:
        return len(self.task_ids - self.per_task.keys())

    @property
    def unexpected(self) -> int:
        """Tasks executed that the API never wrote down as queued."""
        return len(self.per_task.keys() - self.task_ids)

    @property
    def doubled(self) -> int:
        return sum(n - 1 for n in self.per_task.values())

    @property
    def moves(self) -> list[str]:
        """The decisions that moved the share or the phase (the holds left out)."""
        return [d["action"] for d in self.decisions if d["action"] != "hold"]


async def run_rollout(
    world: ServeWorld,
    client: avalkey.Valkey,
    *,
    until: tuple[str, ...],
    rate: float = 60.0,
    timeout_s: float = 300.0,
    executor_env: dict[str, str] | None = None,
    plan: dict[str, str] | None = None,
    fault_from: tuple[float, float] | None = None,
) -> RolloutRun:
    """Run the autopilot from a live share of 0 until its phase is one of ``until``, with the
    API queueing ``rate`` tasks a second meanwhile; then wait until every queued task ran.
    ``plan`` overrides ``SCALED_PLAN``'s settings; ``fault_from`` = (share, percent): once the
    rollout's share reaches ``share``, that percent of the Kafka path's tasks fail."""
    scaled = {**SCALED_PLAN, **(plan or {})}
    settings = world.settings(**scaled)
    await init_topics(settings.kafka)  # the verdicts topic the gate reads
    await set_share(settings, 0.0, by="demo", reason="the runbook's first step")
    keys = RolloutKeys(world.unique)

    async def state() -> RolloutState | None:
        raw = await client.get(keys.state)
        return RolloutState.from_json(raw) if raw else None

    fault_s: float | None = None

    async def arrived() -> bool:
        nonlocal fault_s
        current = await state()
        at, percent = fault_from or (math.inf, 0.0)
        if fault_s is None and current is not None and current.share >= at:
            await client.set(f"{world.results}:fail_kafka", str(percent))
            fault_s = time.monotonic() - started
        return current is not None and current.phase in until

    env = {**os.environ, **world.env, **scaled}
    extra = executor_env or {}
    log = world.tmp / f"rollout.{time.monotonic_ns()}.log"
    with (
        world.sidecar(world.tmp / f"sidecar.{time.monotonic_ns()}.log"),
        world.executor("task_executor_common_r_0", **extra),
        world.executor("task_executor_common_r_1", **extra),
    ):
        await world.wait_members(2)
        out = f"produced.{time.monotonic_ns()}.jsonl"
        api, produced_at = world.api(out, docs=100_000, tasks_per_doc=1, rate=rate)
        started = time.monotonic()
        with api, _Autopilot(env, log):
            await wait_until(arrived, timeout_s, interval_s=1.0, what=f"the rollout {until}")
            seconds = time.monotonic() - started
            api.terminate()
        produced = read_produced(produced_at)
        ids = {str(p["task_id"]) for p in produced}
        await world.wait_executed(client, ids, timeout_s=180)

        async def settled() -> bool:
            pending = await pending_count(client, world.streams, "rag_flow_svr_task_broker")
            return pending == 0 and await world.kafka_settled()

        await wait_until(settled, 120, interval_s=0.5, what="both paths settled")
    entries = await client.xrange(keys.log)
    decisions = [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]
    return RolloutRun(
        state=await state(),
        live=(await read_status(settings)).values.live,
        seconds=seconds,
        decisions=decisions,
        task_ids=ids,
        records=await world.executed(client),
        produced=produced,
        fault_s=fault_s,
    )


def start_autopilot(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``ragflow-sidecar rollout run`` as a process of its own, its output in ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sidecar", "rollout", "run"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


class _Autopilot:
    """``ragflow-sidecar rollout run`` as a process, stopped with SIGTERM (exit 0 expected)."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self._env, self._log = env, log
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> _Autopilot:
        self._process = start_autopilot(self._env, self._log)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None
        self._process.terminate()
        code = self._process.wait(60)
        if code != 0:
            raise AssertionError(f"rollout run exited {code}:\n{self._log.read_text()}")
