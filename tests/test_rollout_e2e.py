"""The autopilot end to end: RAGFlow-like API and executors through ``install()``, the whole
sidecar judging the Redis path, and ``ragflow-sidecar rollout run`` stepping the live share by
the gate's decisions (a plan scaled down: steps of seconds, tens of tasks)."""

from __future__ import annotations

from pathlib import Path

import pytest
import valkey.asyncio as avalkey

from sidecar.dev.local_stack import LocalStack
from tests.ragflow_support import assert_exactly_once
from tests.rollout_support import run_rollout
from tests.serve_support import by_path, make_world

pytestmark = pytest.mark.timeout(600)


# The bound docs/operations.md states for this scaled plan: from the fault to the roll-back.
ROLLBACK_BOUND_S = 60.0
SHARE_REFRESH_S = 0.5


@pytest.mark.parametrize("kafka_failures", [0, 5])
async def test_the_autopilot_ramps_a_clean_shift_and_rolls_back_a_failing_one(
    stack: LocalStack,
    unique: str,
    tmp_path: Path,
    valkey_client: avalkey.Valkey,
    kafka_failures: int,
) -> None:
    """Clean: the plan is climbed to 100 % and the autopilot watches. With 5 % of the Kafka
    path's tasks failing from the 25 % step on: it rolls the share back to 0 by itself within
    the stated bound, and no task is sent to Kafka once RAGFlow's processes have read the
    lowered share. Either way every task runs exactly once, and RAGFlow's processes were never
    restarted."""
    world = await make_world(
        stack,
        unique,
        tmp_path,
        KAFKA_SERVE_PERCENT="100",
        SERVE_SHARE_REFRESH_S=str(SHARE_REFRESH_S),
    )
    until = ("watching",) if kafka_failures == 0 else ("rolled_back",)
    run = await run_rollout(
        world,
        valkey_client,
        until=until,
        plan={"ROLLOUT_STEPS": "10,25,50,100"},
        fault_from=(25.0, kafka_failures) if kafka_failures else None,
    )
    assert run.state is not None
    print(
        f"failures {kafka_failures} % from 25 %: {run.state.phase} at {run.state.share:g} % "
        f"after {run.seconds:.0f} s (fault at {run.fault_s or 0:.0f} s), {len(run.task_ids)} "
        f"tasks {dict(by_path(run.records))}; decisions {run.moves}"
    )
    assert_exactly_once(run.task_ids, run.records)
    if kafka_failures == 0:
        assert (run.state.phase, run.state.share, run.live) == ("watching", 100.0, 100.0)
        assert run.moves == ["start", "promote", "promote", "promote", "promote"]
        return
    assert (run.state.phase, run.state.share, run.live) == ("rolled_back", 0.0, 0.0)
    rollback = next(d for d in run.decisions if d["action"] == "rollback")
    assert "kafka fails more than redis" in rollback["reason"], rollback
    assert float(rollback["share_from"]) >= 25.0, rollback
    assert run.fault_s is not None and run.seconds - run.fault_s <= ROLLBACK_BOUND_S
    # Once the lowered share is read (one refresh after the decision, a second's slack for
    # the autopilot's write and a busy machine), RAGFlow enqueues nothing more on Kafka.
    read_by_s = int(rollback["at_ms"]) / 1000 + SHARE_REFRESH_S + 1.0
    paths = {str(r["task_id"]): ":" in str(r["msg_id"]) for r in run.records}
    late = [p for p in run.produced if p["at"] - p["took_s"] > read_by_s and paths[p["task_id"]]]
    assert not late, f"{len(late)} tasks sent to Kafka after the roll-back was read: {late[:3]}"
