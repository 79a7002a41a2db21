"""The served share shifted step by step (0 -> 25 -> 100 -> 0 %) on a local stack of its own.

Two RAGFlow stand-in executors load ``ragflow_mq.install()`` (MQ_BACKEND=split); per step the
stand-in API queues its documents with KAFKA_SERVE_PERCENT at the step, the demo waits until
every task of the step was executed, and it prints one row per step: tasks produced, executed
via Redis and via Kafka, lost (produced, never executed), doubled (executions beyond one per
task) and the gate's decision over the step's window. Exit 0 when no step lost or doubled a
task, 1 otherwise, 2 when run outside a checkout (the stand-in lives in tests/).

Run from a checkout: ``python tools/shift_demo.py [--docs 40] [--tasks-per-doc 10]``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
STEPS: tuple[int, ...] = (0, 25, 100, 0)
GATE_ENV = {"GATE_MIN_SAMPLE": "50"}
WORK_MS = 20


@dataclass
class StepRow:
    """What one step produced and executed, and what the gate decided over its window."""

    percent: int
    task_ids: set[str]
    seconds: float
    decision: int = 0
    decision_name: str = ""
    reason: str = ""
    window: str = ""  # finished per path in the gate's window (redis/kafka)
    redis: int = 0
    kafka: int = 0
    lost: int = 0
    doubled: int = 0

    def count(self, records: list[dict[str, Any]]) -> None:
        """Fill in the per-path, lost and doubled counts from every execution recorded."""
        mine = [r for r in records if str(r["task_id"]) in self.task_ids]
        per_task = Counter(str(r["task_id"]) for r in mine)
        self.redis = sum(1 for r in mine if ":" not in str(r["msg_id"]))
        self.kafka = len(mine) - self.redis
        self.lost = len(self.task_ids - per_task.keys())
        self.doubled = sum(n - 1 for n in per_task.values())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def render(rows: list[StepRow]) -> str:
    header = (
        f"{'served %':>8}  {'produced':>8}  {'redis':>6}  {'kafka':>6}  {'lost':>5}  "
        f"{'doubled':>7}  {'secs':>5}  {'window r/k':>11}  gate"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(
            f"{row.percent:>8}  {len(row.task_ids):>8}  {row.redis:>6}  {row.kafka:>6}  "
            f"{row.lost:>5}  {row.doubled:>7}  {row.seconds:>5.1f}  {row.window:>11}  "
            f"{row.decision_name.upper()} (exit {row.decision}): {row.reason}"
        )
    return "\n".join(lines)


async def run(docs: int, tasks_per_doc: int, root: Path) -> list[StepRow]:
    # Imported here: they need the checkout's tests/ on sys.path (see main).
    import valkey.asyncio as avalkey  # noqa: PLC0415

    from ragflow_mq.contract import Keys  # noqa: PLC0415
    from sidecar.dev.local_stack import LocalStack, StackConfig  # noqa: PLC0415
    from sidecar.serve.gate import collect  # noqa: PLC0415
    from sidecar.serve.gate_checks import DECISIONS  # noqa: PLC0415
    from sidecar.transport.topics import init_topics  # noqa: PLC0415
    from tests.ragflow_support import read_produced, wait_until  # noqa: PLC0415
    from tests.serve_support import make_world  # noqa: PLC0415

    stack = LocalStack(
        StackConfig(
            root=root / "stack",
            valkey_port=free_port(),
            kafka_port=free_port(),
            kafka_controller_port=free_port(),
        )
    )
    rows: list[StepRow] = []
    try:
        print("starting a local stack (Valkey and Kafka) on free ports ...", flush=True)
        stack.up()
        unique = f"shift{uuid.uuid4().hex[:8]}"
        world = await make_world(stack, unique, root, SERVE_EVIDENCE_FLUSH_S="0.5")
        keys = Keys(unique)
        await init_topics(world.settings().kafka)  # the verdicts topic the gate reads
        client = avalkey.Valkey.from_url(stack.valkey.url)
        # 20 ms of work per task, so the gate compares processing times, not scheduling noise.
        executors = [
            world.executor(f"task_executor_common_shift_{i}", STANDIN_WORK_MS=str(WORK_MS))
            for i in range(2)
        ]
        # The whole sidecar judges the Redis-path share (the served share never reaches Redis).
        sidecar = world.sidecar(root / "sidecar.log")
        try:
            sidecar.start()
            for executor in executors:
                executor.start()
            await world.wait_members(2)
            print(
                "ragflow-sidecar run, and two executors with install() (MQ_BACKEND=split), are up",
                flush=True,
            )
            executed_total = 0
            for index, percent in enumerate(STEPS):
                since_ms = int(time.time() * 1000)
                started = time.monotonic()
                api, out = world.api(
                    f"step{index}.jsonl",
                    docs=docs,
                    tasks_per_doc=tasks_per_doc,
                    KAFKA_SERVE_PERCENT=str(percent),
                    KAFKA_TRAFFIC_PERCENT="100",
                )
                with api:
                    code = await api.await_exit(120)
                if code != 0:
                    raise RuntimeError(f"the stand-in API exited {code}:\n{api.log_text()}")
                ids = {str(p["task_id"]) for p in read_produced(out)}
                await world.wait_executed(client, ids, timeout_s=120)
                row = StepRow(percent, ids, time.monotonic() - started)
                executed_total = len(await world.executed(client))

                async def flushed(expected: int = executed_total) -> bool:
                    totals = await client.hgetall(keys.evidence_total)
                    done = sum(int(totals.get(f"{p}:finished".encode(), 0)) for p in PATHS)
                    return done >= expected

                await wait_until(flushed, 30, interval_s=0.2, what="the evidence flushed")
                settings = world.settings(KAFKA_SERVE_PERCENT=str(percent), **GATE_ENV)
                row.count(await world.executed(client))

                async def judged(
                    expected: int = row.redis, settings: Any = settings, since_ms: int = since_ms
                ) -> bool:
                    report = await collect(settings, since_ms, int(time.time() * 1000))
                    return report.judged.judged >= expected

                await wait_until(judged, 90, interval_s=1.0, what="the step's verdicts")
                report = await collect(settings, since_ms, int(time.time() * 1000))
                row.decision = report.decision
                row.decision_name = DECISIONS[report.decision]
                served = report.served
                row.window = f"{served['redis']['finished']}/{served['kafka']['finished']}"
                row.reason = report.reasons[0].splitlines()[0] if report.reasons else "-"
                rows.append(row)
                print(
                    f"step {index + 1}/{len(STEPS)}: served {percent:>3} %, "
                    f"{len(ids)} tasks executed in {row.seconds:.1f} s "
                    f"(redis {row.redis}, kafka {row.kafka})",
                    flush=True,
                )
            # A second execution would show within a commit interval: recount after one.
            await asyncio.sleep(3)
            records = await world.executed(client)
            for row in rows:
                row.count(records)
        finally:
            sidecar.close()
            for executor in executors:
                if executor.process is not None:
                    try:
                        executor.terminate(30)
                    except Exception:
                        executor.kill()
            await client.aclose()
    finally:
        stack.down()
    return rows


PATHS = ("kafka", "redis")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=40, help="documents per step")
    parser.add_argument("--tasks-per-doc", type=int, default=10, help="tasks per document")
    args = parser.parse_args(argv)
    if not (REPO / "tests" / "ragflow_standin").is_dir():
        print(
            "the shift demo needs a checkout of ragflow-kafka-sidecar: it drives the RAGFlow "
            f"stand-in in tests/ragflow_standin, which is missing under {REPO}",
            file=sys.stderr,
        )
        return 2
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    root = Path(tempfile.mkdtemp(prefix="shift-demo-"))
    try:
        rows = asyncio.run(run(args.docs, args.tasks_per_doc, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print(f"served share shifted {' -> '.join(f'{p} %' for p in STEPS)}, two executors:")
    print(render(rows))
    print()
    print(
        "gate (GATE_MIN_SAMPLE="
        f"{GATE_ENV['GATE_MIN_SAMPLE']}): judged evidence from `ragflow-sidecar run` (the Redis "
        "path's tasks, mirrored, replayed and compared) and the two populations. At 100 % served "
        "nothing reaches Redis, so nothing is judged and the gate holds: 50 % is the last step "
        "it can promote from. Served evidence is kept per minute, so a step's window (column "
        "'window r/k': tasks finished via redis/kafka that the gate saw) also counts steps "
        "that shared its minutes."
    )
    clean = all(row.lost == 0 and row.doubled == 0 for row in rows)
    print("every task executed exactly once" if clean else "tasks were lost or doubled")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
