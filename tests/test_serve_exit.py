"""An executor that ends cleanly leaves the evidence of its last tasks in the state store.

RAGFlow's executor (the stand-in: ``main()``, five slots, synchronous queue calls) is stopped
with SIGTERM while tasks are in hand; they finish during the stop, so their evidence is
recorded in the process's last moments and only the flushes at exit can write it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import valkey.asyncio as avalkey

from sidecar.dev.local_stack import LocalStack
from sidecar.wire.contract import Keys
from tests.ragflow_support import read_produced, wait_until
from tests.serve_support import by_path, make_world

pytestmark = [pytest.mark.kafka39, pytest.mark.ragflow_pins]


# 3600 s: only the flush at exit writes anything. 0.05 s: the periodic flush is due again and
# again while the process exits; it ran on the loop's default executor, which the interpreter
# shuts before atexit, and failed there with "cannot schedule new futures after shutdown".
@pytest.mark.parametrize("flush_s", ["3600", "0.05"])
async def test_the_last_evidence_is_written_when_an_executor_ends(
    stack: LocalStack, unique: str, tmp_path: Path, valkey_client: avalkey.Valkey, flush_s: str
) -> None:
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="50")
    executor = world.executor(
        "task_executor_common_x_0", SERVE_EVIDENCE_FLUSH_S=flush_s, STANDIN_WORK_MS="1500"
    )
    with executor:
        await world.wait_members(1)
        api, out = world.api("produced.jsonl", docs=10, tasks_per_doc=4)
        with api:
            assert await api.await_exit(120) == 0, api.log_text()
        assert len(read_produced(out)) == 40

        async def in_hand() -> bool:
            return len(await world.executed(valkey_client)) >= 3

        await wait_until(in_hand, 120, what="tasks in hand")
        # Ended cleanly, as a deploy ends it: the tasks in hand finish and are acked.
        assert executor.terminate() == 0, executor.log_text()
    log = executor.log_text()
    assert "Traceback" not in log, log
    paths = by_path(await world.executed(valkey_client))
    totals = await valkey_client.hgetall(Keys(unique).evidence_total)
    finished = {path: int(totals.get(f"{path}:finished".encode(), 0)) for path in paths}
    assert finished == dict(paths), (totals, log)
