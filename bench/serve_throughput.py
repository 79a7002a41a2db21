"""Served-path throughput: RAGFlow's queue through ``ragflow_mq.install()``, Kafka versus Redis.

Tasks per second of ``queue_product`` + ``queue_consumer``/``ack`` on the RAGFlow stand-in's
``REDIS_CONN`` (tests/ragflow_standin), patched by ``install()`` with MQ_BACKEND=split at
KAFKA_SERVE_PERCENT=100 (every task to Kafka, acks=all awaited) and at 0 (RAGFlow's own
XADD/XREADGROUP/XACK), alternately, --rounds times each, in this one process: each round
installs with its own Settings (fresh streams, topics, group) and uninstalls after.

Modelled on RAGFlow: --producers threads (default 4, as concurrent API requests) each run
``queue_tasks``-like sequential ``queue_product`` calls, --tasks-per-doc tasks per document;
one executor loop does ``collect()``: ``queue_consumer`` over the queue names priority first
(the priority queue is empty, as for documents of priority 0), then ``get_message()`` and
``ack()``. Unlike RAGFlow it does not sleep 5 s after an empty ``collect()`` (that would time
the sleep). Before each timed round a few tasks warm both clients up (producer connected,
consumer in its group). Valkey runs with hz 500 (--valkey-hz): at its default of 10 a BLOCK 5
on the empty priority queue lasts until the next 100 ms tick, so every collect() would time
Valkey's timer instead of the queue. Time: first produce to last ack. Target: Kafka/Redis
ratio of the medians >= 0.8, else exit 1.

Usage: .venv/bin/python bench/serve_throughput.py [--tasks 3000] [--rounds 3] [--producers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import valkey
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from bench_common import bench_stack, loadavg

import ragflow_mq
from sidecar.config import Settings
from sidecar.config.routing import DEFAULT_ROUTES, PRIORITY_PARSE
from sidecar.dev.local_stack import LocalStack

STANDIN = Path(__file__).resolve().parents[1] / "tests" / "ragflow_standin"
GROUP = "rag_flow_svr_task_broker"  # RAGFlow's SVR_CONSUMER_GROUP_NAME
CONSUMER = "task_executor_bench_0"
WARMUP = 20


def doc_tasks(doc: str, count: int) -> list[dict[str, Any]]:
    """What ``queue_tasks`` sends for one PDF: page ranges of 12, priority 0."""
    return [
        {"id": uuid.uuid4().hex, "doc_id": doc, "from_page": 12 * i, "to_page": 12 * i + 12,
         "progress": 0.0, "name": "report.pdf", "priority": 0, "task_type": "",
         "digest": uuid.uuid4().hex[:16], "begin_at": "2026-08-22 10:15:03"}
        for i in range(count)
    ]  # fmt: skip


async def create_topics(stack: LocalStack, *names: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=stack.kafka.bootstrap_servers)
    await admin.start()
    try:  # as tests/serve_support.make_world: the tasks topic 4 partitions, priority 2
        await admin.create_topics([NewTopic(names[0], 4, 1), NewTopic(names[1], 2, 1)])
    finally:
        await admin.close()


def round_settings(stack: LocalStack, unique: str, percent: int) -> tuple[Settings, str, str]:
    high, low = f"{unique}.te.1.common", f"{unique}.te.0.common"
    routes = {pattern: f"{unique}.tasks" for pattern in DEFAULT_ROUTES}
    routes[PRIORITY_PARSE] = f"{unique}.tasks.priority"
    settings = Settings.from_env({
        "MQ_BACKEND": "split", "KAFKA_TRAFFIC_PERCENT": "100",
        "KAFKA_SERVE_PERCENT": str(percent), "MIRROR_STREAMS": f"{high},{low}",
        "MIRROR_PRIORITY_STREAMS": high, "MIRROR_ROUTES": json.dumps(routes),
        "KAFKA_CONSUMER_GROUP": f"{unique}-executors", "SERVE_KEY_PREFIX": unique,
        "REDIS_URL": stack.valkey.url,
        "KAFKA_BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers,
    })  # fmt: skip
    return settings, high, low


class Executor(threading.Thread):
    """One executor's ``collect()`` loop until ``count`` tasks are acked."""

    def __init__(self, conn: Any, queues: tuple[str, str], count: int) -> None:
        super().__init__(daemon=True)
        self.conn, self.queues, self.count = conn, queues, count
        self.acked = 0
        self.paths: dict[str, int] = {"kafka": 0, "redis": 0}
        self.last_ack = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while self.acked < self.count:
                message = None
                for queue in self.queues:
                    message = self.conn.queue_consumer(queue, GROUP, CONSUMER)
                    if message:
                        break
                if not message:
                    continue
                body = message.get_message()
                if not isinstance(body, dict) or not body.get("id"):
                    raise RuntimeError(f"bad task {body!r}")
                if not message.ack():
                    raise RuntimeError(f"ack of {message.get_msg_id()} failed")
                self.paths["kafka" if ":" in str(message.get_msg_id()) else "redis"] += 1
                self.acked += 1
            self.last_ack = time.perf_counter()
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def produce(conn: Any, queue: str, docs: list[list[dict[str, Any]]]) -> None:
    for tasks in docs:  # one queue_tasks call per document, sequential within it
        for task in tasks:
            if not conn.queue_product(queue, task):
                raise RuntimeError(f"queue_product of {task['id']} failed")


def drive(
    conn: Any,
    queues: tuple[str, str],
    count: int,
    *,
    producers: int,
    per_doc: int,
    timeout_s: float,
) -> tuple[float, float, dict[str, int]]:
    """Produce ``count`` tasks from ``producers`` threads while one executor acks them all;
    returns (end-to-end seconds, produce seconds, acks per path)."""
    docs = [doc_tasks(uuid.uuid4().hex, per_doc) for _ in range(-(-count // per_doc))]
    docs[-1] = docs[-1][: count - per_doc * (len(docs) - 1)]
    executor = Executor(conn, queues, count)
    executor.start()
    errors: list[BaseException] = []

    def producer(share: list[list[dict[str, Any]]]) -> None:
        try:
            produce(conn, queues[1], share)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=producer, args=(docs[i::producers],), daemon=True)
               for i in range(producers)]  # fmt: skip
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    produced = time.perf_counter()
    executor.join(max(timeout_s - (produced - started), 1))
    if errors or executor.error or executor.is_alive():
        raise RuntimeError(f"round failed: {errors or executor.error or 'executor timed out'}"
                           f" ({executor.acked} of {count} acked)")  # fmt: skip
    return executor.last_ack - started, produced - started, executor.paths


def one_round(
    module: ModuleType, stack: LocalStack, path: str, args: argparse.Namespace
) -> tuple[float, float]:
    unique = f"sb{uuid.uuid4().hex[:8]}{path}"
    asyncio.run(create_topics(stack, f"{unique}.tasks", f"{unique}.tasks.priority"))
    settings, high, low = round_settings(stack, unique, 100 if path == "kafka" else 0)
    assert ragflow_mq.install(settings)
    try:
        conn = module.REDIS_CONN
        drive(
            conn, (high, low), WARMUP, producers=1, per_doc=WARMUP, timeout_s=120
        )  # producer connected, group joined
        timeout_s = 120 + args.tasks / 20
        total_s, produce_s, paths = drive(
            conn, (high, low), args.tasks, producers=args.producers,
            per_doc=args.tasks_per_doc, timeout_s=timeout_s,
        )  # fmt: skip
    finally:
        ragflow_mq.uninstall()
    if paths[path] != args.tasks:
        raise RuntimeError(f"{path} round: tasks came back by {paths}")
    return args.tasks / total_s, args.tasks / produce_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000, help="tasks per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per path")
    parser.add_argument("--producers", type=int, default=4, help="concurrent queue_tasks")
    parser.add_argument("--tasks-per-doc", type=int, default=10)
    parser.add_argument("--valkey-hz", type=int, default=500, help="0: Valkey's default (10)")
    parser.add_argument("--only", choices=("kafka", "redis"), help="one path (for profiling)")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="sidecar-bench-"))
    stack = bench_stack(root)
    stack.up()
    try:
        if args.valkey_hz:
            client = valkey.Valkey.from_url(stack.valkey.url)
            client.config_set("hz", args.valkey_hz)
            client.close()
        os.environ["REDIS_URL"] = stack.valkey.url  # the stand-in's RedisDB reads it once
        sys.path.insert(0, str(STANDIN))
        module = importlib.import_module("rag.utils.redis_conn")
        paths = (args.only,) if args.only else ("kafka", "redis")
        rates: dict[str, list[float]] = {path: [] for path in paths}
        print(f"{args.producers} producer threads (concurrent queue_tasks), 1 executor loop, "
              f"{args.tasks:,} tasks per round, {args.tasks_per_doc} per document, "
              f"Valkey hz {args.valkey_hz or 10}", flush=True)  # fmt: skip
        for round_no in range(args.rounds):
            for path in paths if round_no % 2 == 0 else paths[::-1]:
                rate, produce_rate = one_round(module, stack, path, args)
                rates[path].append(rate)
                print(f"round {round_no + 1} {path:5}: {rate:8,.0f} tasks/s end to end, "
                      f"queue_product {produce_rate:8,.0f} tasks/s (load {loadavg()})",
                      flush=True)  # fmt: skip
        if args.only:
            return 0
        kafka, redis = statistics.median(rates["kafka"]), statistics.median(rates["redis"])
        ratio = kafka / redis
        print(f"median: Kafka {kafka:,.0f} tasks/s, Redis {redis:,.0f} tasks/s, "
              f"ratio {ratio:.2f} (target >= 0.8)")  # fmt: skip
        return 0 if ratio >= 0.8 else 1
    finally:
        stack.down()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
