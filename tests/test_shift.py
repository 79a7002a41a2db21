"""``ragflow-sidecar shift``: the live share, over real Valkey (and Kafka, with the RAGFlow
stand-in): set and shown through ``main()``, bad input refused, every change logged, and RAGFlow
processes following a shift without a restart."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import valkey
import valkey.asyncio as avalkey

import sidecar.serve.share as share_module
from sidecar.cli.main import main
from sidecar.config.routing import RouteTable
from sidecar.config.traffic import in_traffic_share
from sidecar.dev.local_stack import LocalStack
from sidecar.wire.contract import Keys
from tests.ragflow_support import assert_exactly_once, read_produced
from tests.serve_support import ServeWorld, make_world

pytestmark = pytest.mark.ragflow_pins


class Shift:
    """``ragflow-sidecar shift`` in this process, on a key prefix of the test's own."""

    def __init__(
        self,
        stack: LocalStack,
        unique: str,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        self.keys = Keys(unique)
        self.client = valkey.Valkey.from_url(stack.valkey.url)
        self._monkeypatch = monkeypatch
        self._capsys = capsys
        self.env = {
            "REDIS_URL": stack.valkey.url,
            "MQ_BACKEND": "split",
            "KAFKA_TRAFFIC_PERCENT": "100",
            "KAFKA_SERVE_PERCENT": "20",
            "SERVE_KEY_PREFIX": unique,
            # Unreachable: shift needs the state store only (a roll-back must not wait on Kafka).
            "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
        }

    def run(self, *args: str) -> tuple[int, str, str]:
        for name, value in self.env.items():
            self._monkeypatch.setenv(name, value)
        self._capsys.readouterr()
        code = main(["shift", *args])
        out, err = self._capsys.readouterr()
        return code, out, err

    @property
    def live(self) -> bytes | None:
        return cast(bytes | None, self.client.get(self.keys.share))

    def log(self) -> list[dict[bytes, bytes]]:
        entries = cast(
            list[tuple[bytes, dict[bytes, bytes]]], self.client.xrange(self.keys.share_log)
        )
        return [fields for _, fields in entries]


@pytest.fixture
def shift(
    stack: LocalStack,
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Iterator[Shift]:
    command = Shift(stack, unique, monkeypatch, capsys)
    yield command
    left = cast(list[bytes], command.client.keys(f"{unique}:*"))
    if left:
        command.client.delete(*left)
    command.client.close()


def test_status_of_a_live_share_never_set_is_the_ceiling(shift: Shift) -> None:
    code, out, _ = shift.run()
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("ceiling       20 % (KAFKA_SERVE_PERCENT")
    assert lines[1] == f"live share    unset: the ceiling is served ({shift.keys.share})"
    assert lines[2].startswith("served share  20 %: RAGFlow's processes follow within ")
    assert "SERVE_SHARE_REFRESH_S=2 s" in lines[2]
    assert lines[-1] == "  none"
    code, same, _ = shift.run("--status")
    assert (code, same) == (0, out)


def test_shift_sets_the_live_share_and_logs_each_change(shift: Shift) -> None:
    code, out, _ = shift.run("--to", "5", "--reason", "step 1")
    assert code == 0, out
    assert out.strip() == (
        f"live share {shift.keys.share} set to 5 % (was unset): RAGFlow serves 5 % from Kafka "
        "within SERVE_SHARE_REFRESH_S=2 s (ceiling KAFKA_SERVE_PERCENT=20 %)"
    )
    assert shift.live == b"5"
    assert shift.run("--to", "12.5")[0] == 0
    code, out, _ = shift.run("--to", "12.5")  # no change: nothing more in the log
    assert code == 0 and f"{shift.keys.share} already 12.5 %" in out, out
    assert shift.run("--to", "0")[0] == 0
    log = shift.log()
    assert [(e[b"from"], e[b"to"]) for e in log] == [(b"", b"5"), (b"5", b"12.5"), (b"12.5", b"0")]
    first = log[0]
    assert (first[b"by"], first[b"reason"], first[b"ceiling"]) == (b"shift", b"step 1", b"20")
    assert b"@" in first[b"actor"]

    code, out, _ = shift.run("--status")
    assert code == 0
    assert "live share    0 % (" in out and "served share  0 %" in out
    changes = out.split("changes, newest first")[1].splitlines()[1:]
    assert len(changes) == 3
    assert changes[0].endswith("12.5 -> 0 %  by shift (" + first[b"actor"].decode() + ")")
    assert changes[2].endswith(": step 1") and "unset -> 5 %" in changes[2]
    code, out, _ = shift.run("--json")
    status = json.loads(out)
    assert (status["ceiling"], status["live"], status["served"]) == (20, 0, 0)
    assert [e["to"] for e in status["log"]] == [0, 12.5, 5]


def test_the_log_keeps_the_last_entries(shift: Shift, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(share_module, "LOG_LENGTH", 3)
    for to in ("1", "2", "3", "4", "5"):
        assert shift.run("--to", to)[0] == 0
    assert [e[b"to"] for e in shift.log()] == [b"3", b"4", b"5"]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("-1", "--to: -1 is out of range (a percentage, 0 to 100)"),
        ("101", "--to: 101 is out of range"),
        ("nan", "--to: nan is out of range"),
        ("banana", "--to: 'banana' is not a number"),
        ("25", "KAFKA_SERVE_PERCENT: --to 25 is above the ceiling KAFKA_SERVE_PERCENT=20"),
    ],
)
def test_bad_input_is_refused_naming_the_flag_or_the_ceiling(
    shift: Shift, value: str, fragment: str
) -> None:
    assert shift.run("--to", "5")[0] == 0
    code, out, err = shift.run(f"--to={value}")
    assert code == 2 and out == "", out
    [line] = err.strip().splitlines()
    assert line.startswith("ragflow-sidecar: error: ") and fragment in line, line
    assert shift.live == b"5" and len(shift.log()) == 1, "a refused shift wrote something"


def test_an_old_cap_is_honoured_until_a_shift_folds_it_in(shift: Shift) -> None:
    shift.client.set(shift.keys.old_cap, "0")  # a roll-back by a gate of an earlier build
    code, out, _ = shift.run()
    assert code == 0
    assert f"old cap       0 % ({shift.keys.old_cap}" in out
    assert "served share  0 %" in out
    code, out, _ = shift.run("--to", "10")
    assert code == 0 and out.strip().endswith(
        f"the old cap {shift.keys.old_cap} (0) is folded in (set to 100)"
    ), out
    assert shift.client.get(shift.keys.old_cap) == b"100"
    [entry] = shift.log()
    assert (entry[b"to"], entry[b"old_cap"]) == (b"10", b"0")
    code, out, _ = shift.run()
    assert "old cap       " not in out and "served share  10 %" in out
    assert out.rstrip().endswith(
        "unset -> 10 %  by shift (" + entry[b"actor"].decode() + "), old cap 0 folded in"
    )


# ---------------------------------------------------------------------------------------------
# RAGFlow's processes follow, without a restart

REFRESH_S = 0.5
# The refresh's period, one read's latency and a busy machine's scheduling.
BOUND_S = REFRESH_S + 1.5


async def _shift_cli(world: ServeWorld, to: str) -> tuple[float, float]:
    """``ragflow-sidecar shift --to`` as an operator runs it (a process of its own); returns
    when it started and when it had returned (the write lies between)."""
    own = ("KAFKA_", "MIRROR_", "REDIS_", "SERVE_", "MQ_")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(own)}, **world.env}
    started = time.time()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "sidecar", "--log-level", "WARNING", "shift", "--to", to),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    assert process.returncode == 0, output.decode()
    return started, time.time()


def _served(doc_id: str, percent: float) -> bool:
    return in_traffic_share(RouteTable().route({"doc_id": doc_id}, 0).key, percent)


async def test_the_live_share_goes_0_25_0_with_no_ragflow_process_restarted(
    stack: LocalStack, unique: str, tmp_path: Path, valkey_client: avalkey.Valkey
) -> None:
    """One executor and one API process (both through ``install()``, the ceiling 100 in
    their env) run through the whole test while the live share goes 0 -> 25 -> 0. Each
    document (two tasks, one ``queue_tasks`` call) queued after a shift plus the refresh
    bound is executed from the path the new share gives it; every task exactly once."""
    world = await make_world(
        stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100", SERVE_SHARE_REFRESH_S=str(REFRESH_S)
    )
    await _shift_cli(world, "0")  # before any RAGFlow process starts: nothing served
    with world.executor("task_executor_common_l_0") as executor:
        await world.wait_members(1)
        # Two-task documents at 20 tasks/s: 0 % for 4 s, 25 % for 7, 0 % for 5 more, then the
        # API is stopped (SIGTERM, between two documents). It queues more than that takes, so
        # that a slow machine's shift commands (each a Python process) never outlast it.
        api, out = world.api("produced.jsonl", docs=1000, tasks_per_doc=2, rate=20)
        with api:
            pids = (executor.pid, api.pid)
            await asyncio.sleep(4)
            raised = await _shift_cli(world, "25")
            await asyncio.sleep(7)
            lowered = await _shift_cli(world, "0")
            await asyncio.sleep(5)
            assert api.poll() is None and executor.poll() is None, "a RAGFlow process ended"
            assert await asyncio.to_thread(api.terminate) == 0, api.log_text()
        produced = read_produced(out)
        ids = {str(p["task_id"]) for p in produced}
        records = await world.wait_executed(valkey_client, ids)
        assert (executor.pid, api.pid) == pids and executor.poll() is None
        executor.terminate()
    records = await world.executed(valkey_client)
    assert_exactly_once(ids, records)
    path = {str(r["task_id"]): "kafka" if ":" in str(r["msg_id"]) else "redis" for r in records}

    docs: dict[str, list[dict[str, Any]]] = {}
    for task in produced:
        docs.setdefault(task["doc_id"], []).append(task)
    served_docs = outside = 0
    for doc_id, tasks in docs.items():
        first, last = min(t["at"] for t in tasks), max(t["at"] for t in tasks)
        paths = {path[str(t["task_id"])] for t in tasks}
        if last < raised[0]:
            assert paths == {"redis"}, f"{doc_id} served before the shift to 25"
        elif first > raised[1] + BOUND_S and last < lowered[0]:
            wanted = "kafka" if _served(doc_id, 25) else "redis"
            assert paths == {wanted}, f"{doc_id} at 25 %: {paths}, wanted {wanted}"
            served_docs += wanted == "kafka"
            outside += wanted == "redis"
        # Lowered: every task after the bound is on Redis, a document decided before included.
        for task in tasks:
            if task["at"] > lowered[1] + BOUND_S:
                assert path[str(task["task_id"])] == "redis", (
                    f"{doc_id} served after the shift to 0"
                )
    print(
        f"live share 0 -> 25 -> 0: {len(docs)} documents, at 25 % {served_docs} from Kafka and "
        f"{outside} from Redis, {sum(p == 'kafka' for p in path.values())} tasks from Kafka"
    )
    assert served_docs >= 3 and outside >= 3, (served_docs, outside)
    log = await valkey_client.xrange(Keys(unique).share_log)
    assert [fields[b"to"] for _, fields in log] == [b"0", b"25", b"0"]
