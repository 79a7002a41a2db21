"""queue_product and executor pickup latency per path, Redis and Kafka side by side (issue 22).

One process, the RAGFlow stand-in's ``REDIS_CONN`` (tests/ragflow_standin) patched by
``ragflow_mq.install()`` with MQ_BACKEND=split at KAFKA_SERVE_PERCENT=50 (--percent), so both
paths run in the same run on the same stack (a local Valkey and Kafka of the bench's own, fresh
streams, topics and group). The main thread queues --tasks RAGFlow parse tasks (the stand-in
API's ``build_tasks``, priority 0, --tasks-per-doc per document, a new doc_id each, so the
sticky hash sends about half to each path) at a steady --rate; one executor thread does what
RAGFlow's ``collect()`` does: ``get_unacked_iterator`` once, then ``queue_consumer`` on the
priority-1 then the priority-0 queue as ``task_executor_common_bench_0``, each task acked at
once, 5 ms of sleep when nothing came. Valkey runs at hz 500 (--valkey-hz, as
serve_throughput.py): at its default 10 the BLOCK 5 read of the empty priority queue would end
on Valkey's 100 ms tick and the pickup would time that.

Measured per path (a task's path is the one it came back by: a Kafka message id is
topic:partition:offset): ``queue_product`` call time, and pickup, from ``queue_product``
returning to the executor's ``queue_consumer`` returning the task (a task picked up before its
``queue_product`` returned counts as 0). 20 warm-up tasks first (producer connected, consumer in
its group), not counted. One executor loop takes about 130 tasks/s (each empty priority-queue
read blocks 5 ms): above that pickup times the backlog, as the output then says. No timed
target: exit 0, or 1 when a task was not queued, not picked up, or picked up more than once.

Usage: .venv/bin/python bench/serve_latency.py [--tasks 2000] [--rate 100] [--percent 50]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any, cast

import valkey
from bench_common import bench_stack, loadavg
from serve_throughput import GROUP, STANDIN, create_topics, round_settings

import ragflow_mq

CONSUMER = "task_executor_common_bench_0"
WARMUP = 20
IDLE_S = 0.005


class Executor(threading.Thread):
    """RAGFlow's ``collect()`` loop: records (task id, path, time) of each task it gets."""

    def __init__(self, conn: Any, queues: tuple[str, str]) -> None:
        super().__init__(daemon=True, name="bench-executor")
        self.conn, self.queues = conn, queues
        self.picked: list[tuple[str, str, float]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def _take(self, message: Any) -> None:
        at = time.perf_counter()
        path = "kafka" if ":" in str(message.get_msg_id()) else "redis"
        body = message.get_message()
        if not isinstance(body, dict) or not body.get("id"):
            raise RuntimeError(f"bad task {body!r}")
        if not message.ack():
            raise RuntimeError(f"ack of {message.get_msg_id()} failed")
        self.picked.append((str(body["id"]), path, at))

    def run(self) -> None:
        try:
            for message in self.conn.get_unacked_iterator(list(self.queues), GROUP, CONSUMER):
                self._take(message)  # none expected: the streams are new
            while not self.stop.is_set():
                message = None
                for queue in self.queues:
                    message = self.conn.queue_consumer(queue, GROUP, CONSUMER)
                    if message:
                        break
                if message:
                    self._take(message)
                else:
                    time.sleep(IDLE_S)
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def make_tasks(build: Any, count: int, per_doc: int) -> list[dict[str, Any]]:
    docs = -(-count // per_doc)
    tasks = [t for _ in range(docs) for t in build(uuid.uuid4().hex, per_doc, 0)]
    return list(tasks[:count])


def produce(
    conn: Any, queue: str, tasks: list[dict[str, Any]], rate: float
) -> dict[str, tuple[float, float, bool]]:
    """``queue_product`` each task at ``rate`` a second (on schedule, not after the last call
    returned); task id -> (call started, call returned, returned True)."""
    timings: dict[str, tuple[float, float, bool]] = {}
    started = time.perf_counter()
    for i, task in enumerate(tasks):
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        before = time.perf_counter()
        ok = bool(conn.queue_product(queue, task))
        timings[str(task["id"])] = (before, time.perf_counter(), ok)
    return timings


def wait_picked(executor: Executor, ids: set[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and executor.error is None and executor.is_alive():
        if ids <= {task_id for task_id, _, _ in list(executor.picked)}:
            return
        time.sleep(0.05)


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..1, 1 is the maximum); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def machine() -> str:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return f"machine: nproc {len(os.sched_getaffinity(0))}, {model}, load average {loadavg()}"


def report(
    timings: dict[str, tuple[float, float, bool]], picked: list[tuple[str, str, float]]
) -> None:
    first: dict[str, tuple[str, float]] = {}
    for task_id, path, at in picked:
        first.setdefault(task_id, (path, at))
    product: dict[str, list[float]] = {"redis": [], "kafka": []}
    pickup: dict[str, list[float]] = {"redis": [], "kafka": []}
    ats: list[float] = []
    for task_id, (before, after, _ok) in timings.items():
        if task_id in first:
            path, at = first[task_id]
            ats.append(at)
            product[path].append((after - before) * 1000)
            pickup[path].append(max(at - after, 0.0) * 1000)
    rows = [("tasks", float(len(product["redis"])), float(len(product["kafka"])), False)]
    rows += [
        (f"{name} {label} (ms)", pct(ms["redis"], q), pct(ms["kafka"], q), True)
        for name, ms in (("queue_product", product), ("pickup", pickup))
        for label, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))
    ]
    print(f"{'':24} {'Redis':>10} {'Kafka':>10} {'Kafka/Redis':>12}")
    for label, redis, kafka, ratio in rows:
        shown = f"{kafka / redis:11.2f}x" if ratio and redis > 0 else f"{'':12}"
        fmt = "10.2f" if ratio else "10.0f"
        print(f"{label:24} {redis:{fmt}} {kafka:{fmt}} {shown}")
    began = min(before for before, _, _ in timings.values())
    queued = max(after for _, after, _ in timings.values())
    last = max(ats, default=queued)
    behind = " (it did not keep up: pickup includes the backlog)" if last - queued > 0.5 else ""
    print(f"queued {len(timings) / (queued - began):,.0f}/s; the executor picked up "
          f"{len(ats) / (last - began):,.0f}/s, its last pickup {last - queued:.2f} s after "
          f"the last queue_product returned{behind}")  # fmt: skip


def check(
    timings: dict[str, tuple[float, float, bool]], picked: list[tuple[str, str, float]]
) -> list[str]:
    """What went wrong: tasks not queued, not picked up, picked up twice, or unknown."""
    counts = Counter(task_id for task_id, _, _ in picked)
    problems = [f"queue_product returned False for {i}" for i, t in timings.items() if not t[2]]
    problems += [f"never picked up: {i}" for i in timings if i not in counts]
    problems += [f"picked up {n} times: {i}" for i, n in counts.items() if n > 1]
    problems += [f"picked up but not queued here: {i}" for i in counts if i not in timings]
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000, help="measured tasks")
    parser.add_argument("--rate", type=float, default=100.0, help="tasks queued a second")
    parser.add_argument("--percent", type=int, default=50, help="KAFKA_SERVE_PERCENT")
    parser.add_argument("--tasks-per-doc", type=int, default=1)
    parser.add_argument("--valkey-hz", type=int, default=500, help="0: Valkey's default (10)")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="for the last pickups")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="sidecar-bench-"))
    stack = bench_stack(root)
    stack.up()
    executor: Executor | None = None
    try:
        if args.valkey_hz:
            with closing(valkey.Valkey.from_url(stack.valkey.url)) as client:
                client.config_set("hz", args.valkey_hz)
        os.environ["REDIS_URL"] = stack.valkey.url  # the stand-in's RedisDB reads it once
        sys.path.insert(0, str(STANDIN))
        module = importlib.import_module("rag.utils.redis_conn")
        build = importlib.import_module("ragflow_api").build_tasks
        unique = f"sl{uuid.uuid4().hex[:8]}"
        asyncio.run(create_topics(stack, f"{unique}.tasks", f"{unique}.tasks.priority"))
        settings, high, low = round_settings(stack, unique, args.percent)
        assert ragflow_mq.install(settings)
        conn = module.REDIS_CONN
        print(machine(), flush=True)
        print(f"{args.tasks:,} tasks at {args.rate:g}/s, KAFKA_SERVE_PERCENT={args.percent}, "
              f"{args.tasks_per_doc} per document, 1 executor thread, "
              f"Valkey hz {args.valkey_hz or 10}", flush=True)  # fmt: skip
        executor = Executor(conn, (high, low))
        executor.start()
        warmup = produce(conn, low, make_tasks(build, WARMUP, 1), args.rate)
        wait_picked(executor, set(warmup), args.timeout_s)
        if {path for _, path, _ in list(executor.picked)} != {"redis", "kafka"}:
            raise RuntimeError(f"warm-up: not both paths picked up: {executor.picked}")
        timings = produce(conn, low, make_tasks(build, args.tasks, args.tasks_per_doc), args.rate)
        wait_picked(executor, set(timings), args.timeout_s)
        time.sleep(1.0)  # a duplicate delivered late is caught too
        executor.stop.set()
        executor.join(10)
        if executor.error is not None:
            raise RuntimeError(f"the executor failed: {executor.error!r}")
        picked = executor.picked
        problems = check({**warmup, **timings}, picked)
        report(timings, picked)
        conn._ragflow_mq_runtime.flush_evidence()
        with closing(valkey.Valkey.from_url(stack.valkey.url)) as client:
            totals = cast(
                dict[bytes, bytes], client.hgetall(ragflow_mq.Keys(unique).evidence_total)
            )
        print(f"diverted to Redis (Kafka over SERVE_ENQUEUE_TIMEOUT_MS): "
              f"{int(totals.get(b'kafka:diverted', 0))}; load average {loadavg()}")  # fmt: skip
        for problem in problems[:20]:
            print(problem)
        if problems:
            print(f"FAILED: {len(problems)} problem(s): not every task picked up exactly once")
            return 1
        print(f"all {len(timings) + len(warmup):,} tasks picked up exactly once")
        return 0
    finally:
        if executor is not None:
            executor.stop.set()
            executor.join(10)
        ragflow_mq.uninstall()
        stack.down()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
