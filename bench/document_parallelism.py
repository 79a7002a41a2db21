"""One big document on several executors: Redis versus Kafka, side by side in one run.

RAGFlow splits a PDF into 12-page tasks, and on Redis every idle executor slot takes the next
one. This runs one document of --tasks tasks (default 30) on --executors stand-in executors
(tests/ragflow_standin: RAGFlow's collect()/handle_task shape, MAX_CONCURRENT_TASKS slots,
default 5), each task --task-ms long (default 6000), once with KAFKA_SERVE_PERCENT=0 (RAGFlow's
own Redis path) and once at 100 (every task served from Kafka), alternating --rounds times,
each round in a world of its own (streams, topics with init-topics' partition counts: 8 for
parse, 4 for priority parse; the executors' group; state-store keys). The time of a round is
from the first task's start to the last one's end (the stand-in records each start on one
clock; a task lasts --task-ms). Printed: each round's time and tasks per executor, the median
per path and the Kafka/Redis ratio. Target: ratio <= 1.2, else exit 1.

Usage: .venv/bin/python bench/document_parallelism.py [--tasks 30] [--executors 3]
       [--slots 5] [--task-ms 6000] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack, closing
from pathlib import Path

import valkey
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from bench_common import alternating, bench_stack, loadavg

from sidecar.config.routing import DEFAULT_ROUTES, PRIORITY_PARSE
from sidecar.dev.local_stack import LocalStack
from sidecar.transport.topics import PARSE_PRIORITY_TOPIC, PARSE_TOPIC, TOPIC_PLAN

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.ragflow_support import StandinProcess, standin_env

TARGET_RATIO = 1.2
PERCENT = {"redis": "0", "kafka": "100"}


async def _create_topics(bootstrap: str, tasks: str, priority: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(tasks, TOPIC_PLAN[PARSE_TOPIC], 1),
                NewTopic(priority, TOPIC_PLAN[PARSE_PRIORITY_TOPIC], 1),
            ]
        )
    finally:
        await admin.close()


async def _members(bootstrap: str, group: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        responses = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    return sum(
        len(g["members"])
        for r in responses
        for g in r.to_object()["groups"]
        if g["state"] == "Stable"
    )


def _wait(what: str, ready: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def one_round(
    stack: LocalStack, root: Path, path: str, args: argparse.Namespace
) -> tuple[float, Counter[str]]:
    """The makespan of one document on ``path``, and the tasks each executor ran."""
    unique = f"dp{uuid.uuid4().hex[:8]}"
    tasks_topic, priority_topic = f"{unique}.tasks", f"{unique}.tasks.priority"
    bootstrap = stack.kafka.bootstrap_servers
    asyncio.run(_create_topics(bootstrap, tasks_topic, priority_topic))
    routes = {pattern: tasks_topic for pattern in DEFAULT_ROUTES}
    routes[PRIORITY_PARSE] = priority_topic
    high, low = f"{unique}.te.1.common", f"{unique}.te.0.common"
    group = f"{unique}-executors"
    results = f"{unique}:results"
    extra = {
        "MQ_BACKEND": "split",
        "KAFKA_TRAFFIC_PERCENT": "100",
        "KAFKA_SERVE_PERCENT": PERCENT[path],
        "MIRROR_STREAMS": f"{high},{low}",
        "MIRROR_PRIORITY_STREAMS": high,
        "MIRROR_ROUTES": json.dumps(routes),
        "KAFKA_CONSUMER_GROUP": group,
        "SERVE_KEY_PREFIX": unique,
        "SERVE_SESSION_TIMEOUT_MS": "6000",
        # The bench's Valkey is seconds old, and a store younger than twice this is read with
        # caution (its claims may have been lost): a site's store is not.
        "SERVE_CLAIM_REFRESH_S": "1",
    }
    env = standin_env(stack, prefix=unique, results_key=results, install=True, extra=extra)
    logs = root / unique
    logs.mkdir()
    with ExitStack() as running, closing(valkey.Valkey.from_url(stack.valkey.url)) as client:
        for n in range(args.executors):
            running.enter_context(
                StandinProcess.executor(
                    env,
                    logs,
                    f"task_executor_common_{n}_0",
                    STANDIN_WORK_MS=str(args.task_ms),
                    MAX_CONCURRENT_TASKS=str(args.slots),
                )
            )
        if path == "kafka":
            _wait(
                f"{args.executors} group members",
                lambda: asyncio.run(_members(bootstrap, group)) == args.executors,
                120,
            )
        else:
            time.sleep(3)  # the executors' first collect(): Redis needs no group to settle
        out = logs / "produced.jsonl"
        api = StandinProcess.api(env, logs, out, docs=1, tasks_per_doc=args.tasks)
        with api:
            if api.wait(120) != 0:
                raise RuntimeError(api.log_text())

        def executed() -> list[dict[str, object]]:
            return [json.loads(r) for r in client.lrange(results, 0, -1)]  # type: ignore[union-attr]

        _wait(f"{args.tasks} executions", lambda: len(executed()) >= args.tasks, 600)
        records = executed()
    ids = Counter(str(r["task_id"]) for r in records)
    if len(ids) != args.tasks or max(ids.values()) != 1:
        raise RuntimeError(f"{path}: not every task ran exactly once: {ids}")
    starts = [float(r["t"]) for r in records]  # type: ignore[arg-type]
    span_s = max(starts) - min(starts) + args.task_ms / 1000
    return span_s, Counter(str(r["consumer"]) for r in records)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=30, help="tasks of the one document")
    parser.add_argument("--executors", type=int, default=3)
    parser.add_argument("--slots", type=int, default=5, help="MAX_CONCURRENT_TASKS")
    parser.add_argument("--task-ms", type=int, default=6000, help="how long each task runs")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of each path")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sidecar-bench-"))
    stack = bench_stack(root)
    stack.up()
    try:
        with closing(valkey.Valkey.from_url(stack.valkey.url)) as client:
            client.config_set("hz", 100)  # RAGFlow's BLOCK 5 on the empty priority queue
        print(
            f"one document of {args.tasks} tasks of {args.task_ms} ms, {args.executors} "
            f"executors x {args.slots} slots; load average {loadavg()}",
            flush=True,
        )
        spans: dict[str, list[float]] = {"redis": [], "kafka": []}
        for round_no, path in alternating(args.rounds, ("redis", "kafka")):
            span_s, per_executor = one_round(stack, root, path, args)
            spans[path].append(span_s)
            counts = sorted(per_executor.values(), reverse=True)
            print(f"round {round_no} {path:5}: {span_s:6.2f} s, tasks per executor {counts}",
                  flush=True)  # fmt: skip
        redis_s, kafka_s = (statistics.median(spans[p]) for p in ("redis", "kafka"))
        ratio = kafka_s / redis_s
        print(f"median: redis {redis_s:.2f} s, kafka {kafka_s:.2f} s; kafka/redis ratio "
              f"{ratio:.2f} (target <= {TARGET_RATIO}); load average {loadavg()}")  # fmt: skip
        return 0 if ratio <= TARGET_RATIO else 1
    finally:
        stack.down()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
