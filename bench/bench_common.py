"""What the benchmarks share: free ports, the load average, a local stack of their own, the
sidecar as a subprocess, and what of a stream reached Kafka."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import valkey
from aiokafka import AIOKafkaConsumer, TopicPartition

from sidecar.dev.local_stack import LocalStack, StackConfig
from sidecar.dev.samples import ragflow_tasks
from sidecar.transport.message import encode_task
from sidecar.transport.topics import DLQ_TOPIC, TASK_TOPICS, TOPIC_PLAN

_SIDECAR_PREFIXES = ("KAFKA_", "MIRROR_", "REDIS_", "SHADOW_", "SIDECAR_", "OTEL_")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages: the machine may be shared, so each line has them."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def bench_stack(root: Path) -> LocalStack:
    """A Valkey and a Kafka of the bench's own under ``root``, on free ports of 127.0.0.1."""
    return LocalStack(StackConfig(root, free_port(), free_port(), free_port()))


def environment_without_sidecar_settings() -> dict[str, str]:
    """This process's environment less every variable the sidecar reads, for a child sidecar
    configured by the bench alone."""
    return {k: v for k, v in os.environ.items() if not k.startswith(_SIDECAR_PREFIXES)}


def fill(url: str, stream: str, count: int) -> None:
    """XADD ``count`` RAGFlow-shaped tasks of all five kinds, pipelined 5,000 at a time."""
    client = valkey.Valkey.from_url(url)
    tasks = ragflow_tasks(count)
    for start in range(0, count, 5000):
        pipe = client.pipeline(transaction=False)
        for task in tasks[start : start + 5000]:
            pipe.xadd(stream, {"message": encode_task(task)})
        pipe.execute()
    client.close()


def sidecar_command(command: str) -> list[str]:
    """The command line that runs ``ragflow-sidecar <command>`` from this virtualenv."""
    script = Path(sys.executable).with_name("ragflow-sidecar")
    base = [str(script)] if script.exists() else [sys.executable, "-m", "sidecar"]
    return [*base, command]


def stop_sidecar(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM, and SIGKILL if it has not exited in 60 s; returns the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


async def count_in_kafka(bootstrap: str, stream: str) -> tuple[int, int]:
    """(records, distinct x-redis-id) in the task topics and the DLQ that came from ``stream``.

    Read without a group from the beginning to the end offsets taken at the start.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
    )
    await consumer.start()
    try:
        parts = [
            TopicPartition(topic, partition)
            for topic in (*TASK_TOPICS, DLQ_TOPIC)
            for partition in range(TOPIC_PLAN[topic])
        ]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        wanted = stream.encode()
        records = 0
        ids: set[bytes] = set()
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            fetched = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            for batch in fetched.values():
                for record in batch:
                    headers = dict(record.headers)
                    if headers.get("x-redis-stream") == wanted:
                        records += 1
                        ids.add(headers["x-redis-id"])
        return records, len(ids)
    finally:
        await consumer.stop()
