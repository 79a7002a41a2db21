"""What every benchmark shares: free ports, the load average, a local stack of its own, the
sidecar as a child process, and the mirror's rate on its own."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import valkey
from aiokafka import AIOKafkaConsumer, TopicPartition

from sidecar.app.wiring import running_mirror
from sidecar.config import Settings
from sidecar.dev.local_stack import LocalStack, StackConfig
from sidecar.dev.samples import ragflow_tasks
from sidecar.transport.message import encode_task
from sidecar.transport.topics import DLQ_TOPIC, TASK_TOPICS, TOPIC_PLAN

_SIDECAR_PREFIXES = ("KAFKA_", "MIRROR_", "REDIS_", "SHADOW_", "SIDECAR_", "OTEL_")

# Issue 13's throughput target for `run`: this many verdicts/s, or this share of the mirror
# alone measured in the same run, whichever the machine allows (join and e2e benches).
TARGET_RATE = 5_000.0
TARGET_MIRROR_RATIO = 0.3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages: the machine may be shared, so each line has them."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def alternating(rounds: int, kinds: Sequence[str]) -> Iterator[tuple[int, str]]:
    """Each of ``kinds`` once a round, in order in even rounds and reversed in odd ones, so that
    none always runs first (on a warmer or a busier machine)."""
    for round_no in range(rounds):
        for kind in kinds if round_no % 2 == 0 else kinds[::-1]:
            yield round_no, kind


def bench_stack(root: Path) -> LocalStack:
    """A Valkey and a Kafka of the bench's own under ``root``, on free ports of 127.0.0.1."""
    return LocalStack(StackConfig(root, free_port(), free_port(), free_port()))


def environment_without_sidecar_settings() -> dict[str, str]:
    """This process's environment less every variable the sidecar reads, for a child sidecar
    configured by the bench alone."""
    return {k: v for k, v in os.environ.items() if not k.startswith(_SIDECAR_PREFIXES)}


def fill(url: str, stream: str, count: int) -> None:
    """XADD ``count`` RAGFlow-shaped tasks of all five kinds, pipelined 5,000 at a time (made
    5,000 at a time too, so a backlog of millions does not sit in this process first)."""
    client = valkey.Valkey.from_url(url)
    for start in range(0, count, 5000):
        pipe = client.pipeline(transaction=False)
        for task in ragflow_tasks(min(5000, count - start)):
            pipe.xadd(stream, {"message": encode_task(task)})
        pipe.execute()
    client.close()


def run_env(stack: LocalStack, stream: str, name: str) -> dict[str, str]:
    """A sidecar on the bench's stack reading ``stream`` from its start, its shadow group and
    instance named ``<name>-<run>`` for a run of its own."""
    run = uuid.uuid4().hex[:8]
    return {
        "REDIS_URL": stack.valkey.url,
        "KAFKA_BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers,
        "MIRROR_STREAMS": stream,
        "MIRROR_START": "earliest",
        "SHADOW_GROUP": f"{name}-{run}",
        "SIDECAR_INSTANCE": f"{name}-{run}",
    }


def rss_kib(pid: int) -> tuple[int, int] | None:
    """VmRSS and VmHWM (peak RSS) of ``pid`` in KiB, or ``None`` once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    values = {}
    for line in status.splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0])
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


def process_cpu_s(pid: int | None) -> float:
    """CPU seconds (user and system) a process has used, from ``/proc``; 0 when it is gone."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime and stime, fields 14 and 15 of stat(5), counted after the command's ")".
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class StackCpu:
    """CPU seconds the stack's Kafka broker and Valkey used while entered: on one machine they
    share its CPUs with the sidecar, so they bound what it can do as much as its own CPU."""

    def __init__(self, stack: LocalStack) -> None:
        self._pids = {"kafka": stack.kafka.process.pid(), "valkey": stack.valkey.process.pid()}
        self.seconds = dict.fromkeys(self._pids, 0.0)

    def __enter__(self) -> StackCpu:
        self._started = {name: process_cpu_s(pid) for name, pid in self._pids.items()}
        return self

    def __exit__(self, *exc: object) -> None:
        for name, pid in self._pids.items():
            self.seconds[name] += process_cpu_s(pid) - self._started[name]

    def per_item_us(self, count: int) -> dict[str, float]:
        """Each process's CPU microseconds per item, over ``count`` items."""
        return {name: seconds * 1e6 / count for name, seconds in self.seconds.items()}


def mib(kib: float) -> str:
    return f"{kib / 1024:7.1f} MiB"


def wait_ready(port: int, process: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    """Until the child sidecar's ``/readyz`` on ``port`` answers 200."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the sidecar exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the sidecar was not ready in {timeout_s:.0f} s")


def spawn_sidecar(command: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``ragflow-sidecar <command>`` configured by ``env`` alone (none of this process's sidecar
    settings), its output appended to ``log``."""
    script = Path(sys.executable).with_name("ragflow-sidecar")
    base = [str(script)] if script.exists() else [sys.executable, "-m", "sidecar"]
    with log.open("ab") as out:
        return subprocess.Popen(
            [*base, *command.split()],
            env={**environment_without_sidecar_settings(), **env},
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
        )


def stop_sidecar(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM, and SIGKILL if it has not exited in 60 s; returns the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def whole_sidecar_settings(stack: LocalStack, stream: str, name: str, **extra: str) -> Settings:
    """A whole sidecar (mirror, shadow, judge) draining ``stream`` from its start, in groups of a
    run of its own named after ``name``; ``extra`` adds to or overrides the settings."""
    run = uuid.uuid4().hex[:8]
    return Settings.from_env(
        {
            "REDIS_URL": stack.valkey.url,
            "KAFKA_BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers,
            "MIRROR_STREAMS": stream,
            "MIRROR_PRIORITY_STREAMS": "none",
            "MIRROR_START": "earliest",
            "MIRROR_BLOCK_MS": "100",
            "MIRROR_GROUP": f"{name}_mirror_{run}",
            "SHADOW_GROUP": f"{name}-shadow-{run}",
            "SHADOW_START": "latest",
            "SIDECAR_INSTANCE": f"{name}-{run}",
            "SIDECAR_METRICS_PORT": "0",
            **extra,
        }
    )


async def mirror_rate(
    settings: Settings,
    count: int,
    measured: contextlib.AbstractContextManager[object] | None = None,
) -> float:
    """Entries per second of the mirror alone reading ``count`` entries, from its start until
    Kafka has them all; ``measured`` (a profiler, say) is entered for just that time."""
    stop = asyncio.Event()
    async with running_mirror(settings) as mirror:
        with measured or contextlib.nullcontext():
            started = time.perf_counter()
            running = asyncio.create_task(mirror.run(stop))
            while mirror.stats.read < count:  # noqa: ASYNC110 - polls a counter, not an event
                await asyncio.sleep(0.005)
            # read counts a batch before Kafka has it; the loop finishes it before returning.
            stop.set()
            await running
            elapsed = time.perf_counter() - started
    return count / elapsed


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
