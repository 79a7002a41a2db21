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
        stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100", SERVE_SHARE_REFRESH_S="0.5"
    )
    until = ("watching",) if kafka_failures == 0 else ("rolled_back",)
    run = await run_rollout(
        world, valkey_client, until=until,
        executor_env={"STANDIN_FAIL_KAFKA_PERCENT": str(kafka_failures)},
    )  # fmt: skip
    assert run.state is not None
    print(
        f"failures {kafka_failures} %: {run.state.phase} at {run.state.share:g} % after "
        f"{run.seconds:.0f} s, {len(run.task_ids)} tasks {dict(by_path(run.records))}; "
        f"decisions {run.moves}"
    )
    assert_exactly_once(run.task_ids, run.records)
    if kafka_failures == 0:
        assert (run.state.phase, run.state.share, run.live) == ("watching", 100.0, 100.0)
        assert run.moves == ["start", "promote", "promote", "promote"]
    else:
        assert (run.state.phase, run.state.share, run.live) == ("rolled_back", 0.0, 0.0)
        rollback = next(d for d in run.decisions if d["action"] == "rollback")
        assert "kafka fails more than redis" in rollback["reason"], rollback
