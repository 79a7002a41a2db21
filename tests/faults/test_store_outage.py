"""The state store (``SIDECAR_STATE_URL``, apart from RAGFlow's Valkey) down for 60 s while
RAGFlow's API enqueues and its executors run: new tasks go to Redis while the live share
cannot be read (also from an API process started during the outage, which must not serve
the ceiling), a ``shift --to 0`` given during the outage takes effect when the store is back,
and every task runs exactly once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import valkey
import valkey.asyncio as avalkey

from sidecar.dev.local_stack import LocalStack, LocalValkey
from sidecar.wire.contract import Keys
from tests import tiers
from tests.conftest import own_valkey
from tests.ragflow_support import assert_exactly_once, pending_count, read_produced, wait_until
from tests.serve_support import by_path, make_world

pytestmark = [pytest.mark.faults, pytest.mark.timeout(480)]

OUTAGE_S = 60.0
RATE = 2.0  # tasks a second from each API process
RAGFLOW_GROUP = "rag_flow_svr_task_broker"


@pytest.fixture
@tiers.starts_servers
def state_store(tmp_path: Path) -> Iterator[LocalValkey]:
    """The state store, persisting to an append-only file: stopped and started again, it keeps
    its claims and done markers (a store that forgets them is another test's)."""
    with own_valkey(tmp_path / "state-aof", aof=True) as server:
        yield server


def _shift(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sidecar", "--log-level", "WARNING", "shift", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def test_store_down_60_s_new_tasks_on_redis_and_a_roll_back_holds(
    stack: LocalStack,
    unique: str,
    tmp_path: Path,
    valkey_client: avalkey.Valkey,
    state_store: LocalValkey,
) -> None:
    world = await make_world(
        stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100",
        SIDECAR_STATE_URL=state_store.url, SERVE_SHARE_REFRESH_S="0.5",
    )  # fmt: skip
    cli_env = {**world.child_env(install=False), **world.env}
    setup = _shift(cli_env, tmp_path / "shift-100.log", "--to", "100")
    assert setup.wait(60) == 0, (tmp_path / "shift-100.log").read_text()
    with (
        world.executor("task_executor_common_a_0", STANDIN_WORK_MS="300") as a,
        world.executor("task_executor_common_b_0", STANDIN_WORK_MS="300") as b,
    ):
        await world.wait_members(2)
        api, out = world.api("before.jsonl", docs=400, tasks_per_doc=1, rate=RATE)
        late_api, late_out = None, tmp_path / "late.jsonl"
        with api:

            async def queued(n: int) -> int:
                def enough() -> bool:
                    return out.exists() and len(read_produced(out)) >= n

                await wait_until(enough, 60, interval_s=0.1, what=f"{n} tasks queued")
                return len(read_produced(out))

            await queued(20)
            await asyncio.to_thread(state_store.stop)
            down_at = len(read_produced(out))
            outage_started = time.monotonic()
            await asyncio.sleep(10)
            # An API process started during the outage: it cannot read the share.
            late_api, late_out = world.api("late.jsonl", docs=20, tasks_per_doc=1, rate=RATE)
            late_api.start()  # stopped by pid below, or by the with's exit on a failure
            await asyncio.sleep(10)
            # The roll-back, given while the store is down: it waits for the store.
            roll_back = _shift(cli_env, tmp_path / "shift-0.log", "--to", "0", "--wait-s", "120")
            await asyncio.sleep(OUTAGE_S - (time.monotonic() - outage_started))
            assert roll_back.poll() is None, "the roll-back did not wait for the store"
            await asyncio.to_thread(state_store.start)
            up_at = len(read_produced(out))
            assert await asyncio.to_thread(roll_back.wait, 60) == 0, (
                tmp_path / "shift-0.log"
            ).read_text()
            await queued(up_at + 40)  # 20 s of tasks after the outage
            api.terminate()
        assert late_api is not None
        assert await late_api.await_exit(60) == 0, late_api.log_text()
        produced = read_produced(out)
        late = read_produced(late_out)
        ids = {str(p["task_id"]) for p in produced + late}
        await world.wait_executed(valkey_client, ids, timeout_s=180)

        async def settled() -> bool:
            pending = await pending_count(valkey_client, world.streams, RAGFLOW_GROUP)
            return pending == 0 and await world.kafka_settled()

        await wait_until(settled, 120, interval_s=0.5, what="both paths settled")
        a.terminate()
        b.terminate()
        api_log = api.log_text()

    assert all(p["ok"] for p in produced + late)
    records = await world.executed(valkey_client)
    assert_exactly_once(ids, records)
    path_of = {str(r["task_id"]): "kafka" if ":" in str(r["msg_id"]) else "redis" for r in records}
    order = [str(p["task_id"]) for p in produced]
    assert {path_of[t] for t in order[:down_at]} == {"kafka"}, "served before the outage"
    # A refresh (0.5 s) and a failed read after the store went: a task or two more, at most.
    during = order[down_at + 2 : up_at]
    assert {path_of[t] for t in during} == {"redis"}, "served while the share was unreadable"
    assert {path_of[str(p["task_id"])] for p in late} == {"redis"}, "the late API served"
    after = order[up_at:]
    assert {path_of[t] for t in after} == {"redis"}, "the roll-back given in the outage lost"
    state = valkey.Valkey.from_url(state_store.url)
    try:
        assert state.get(Keys(unique).share) == b"0"
    finally:
        state.close()
    # One line for the outage, not one per task or per refresh.
    assert api_log.count("cannot read the live share") == 1, api_log
    assert api_log.count("could not write its evidence") <= 1, api_log
    print(
        f"store down {OUTAGE_S:.0f} s: {len(ids)} tasks, {by_path(records)}; "
        f"{len(during)} queued in the outage on Redis, {len(late)} from an API started in it, "
        f"{len(after)} after it on Redis (rolled back to 0 during it)"
    )
