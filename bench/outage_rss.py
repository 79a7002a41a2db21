"""Sidecar memory (RSS) through a Kafka outage, while RAGFlow keeps enqueueing tasks.

On a local stack of its own (real Valkey and Kafka on free ports), the bench starts the real
sidecar as a subprocess (``ragflow-sidecar mirror``, ``run``, or both in turn), and a writer
that XADDs RAGFlow-shaped tasks (``sidecar.dev.samples.ragflow_tasks``) at a steady ``--rate``.
After ``--warmup-s`` the Kafka broker is stopped for ``--outage-s`` while the writer goes on, then
started again; the writer stops ``--recovery-s`` after Kafka is back, and the bench waits until
the mirror's group has read and acked everything. The sidecar's VmRSS is read from
/proc/<pid>/status every second.

Printed: RSS before the outage, peak during it, peak while catching up, after recovery, and
peak/before. Then every entry written must be in Kafka (records whose ``x-redis-stream`` header
is the bench's stream, counted by ``x-redis-id``) and the sidecar must exit 0 on SIGTERM; the
exit status is 1 otherwise.

Why memory stays bounded: the mirror reads a batch (XREADGROUP COUNT MIRROR_BATCH), may read
one more while Kafka acknowledges it, and reads nothing further until the first is in Kafka
(``Mirror.run``). While Kafka is away it retries those two batches with backoff; everything
written meanwhile waits in the Valkey stream, not in the sidecar. So the sidecar holds at most
2 x MIRROR_BATCH entries whatever the outage's length.

Usage: .venv/bin/python bench/outage_rss.py [--outage-s 60] [--rate 500] [--command mirror run]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import valkey
from bench_common import (
    bench_stack,
    count_in_kafka,
    loadavg,
    mib,
    rss_kib,
    run_env,
    spawn_sidecar,
    stop_sidecar,
)

from sidecar.config import Settings
from sidecar.dev.local_stack import LocalStack
from sidecar.dev.samples import ragflow_tasks
from sidecar.transport.message import encode_task
from sidecar.transport.topics import init_topics

BATCH = 500
GROUP = "bench_outage_mirror"
SAMPLE_S = 1.0


@dataclass
class Sampler:
    """Reads the sidecar's RSS every second, tagged with the phase the bench is in."""

    pid: int
    phase: str = "warmup"
    samples: list[tuple[float, str, int]] = field(default_factory=list)
    hwm_kib: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            reading = rss_kib(self.pid)
            if reading is None:
                return
            self.samples.append((time.monotonic() - started, self.phase, reading[0]))
            self.hwm_kib = reading[1]
            self._stop.wait(SAMPLE_S)

    def stop(self) -> None:
        self._stop.set()

    def values(self, *phases: str) -> list[int]:
        return [kib for _, phase, kib in self.samples if phase in phases]


class Writer:
    """XADDs pre-encoded RAGFlow tasks at a steady rate until stopped (a thread of its own)."""

    def __init__(self, url: str, stream: str, rate: int, payloads: list[bytes]) -> None:
        self.url, self.stream, self.rate, self.payloads = url, stream, rate, payloads
        self.written = 0
        self.behind_s = 0.0  # the most the schedule slipped: the rate held if this stays small
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="writer", daemon=True)

    def _run(self) -> None:
        client = valkey.Valkey.from_url(self.url)
        started = time.perf_counter()
        while not self._stop.is_set():
            due = started + self.written / self.rate
            delay = due - time.perf_counter()
            if delay > 0:
                self._stop.wait(delay)
            else:
                self.behind_s = max(self.behind_s, -delay)
            payload = self.payloads[self.written % len(self.payloads)]
            client.xadd(self.stream, {"message": payload})
            self.written += 1
        client.close()

    def stop(self) -> int:
        self._stop.set()
        self.thread.join()
        return self.written


def group_state(client: valkey.Valkey, stream: str) -> tuple[int, int] | None:
    """(lag, pending) of the mirror's group, or ``None`` before the group exists."""
    try:
        groups = client.xinfo_groups(stream)
    except valkey.ResponseError:
        return None
    for info in groups:
        if info["name"] in (GROUP, GROUP.encode()):
            return int(info.get("lag") or 0), int(info["pending"])
    return None


def wait_mirroring(
    client: valkey.Valkey, stream: str, process: subprocess.Popen[bytes], rate: int
) -> None:
    """Wait until the sidecar's mirror has its group and keeps up (under a second behind)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the sidecar exited with {process.returncode}")
        state = group_state(client, stream)
        if state is not None and state[0] + state[1] < rate:
            return
        time.sleep(0.2)
    raise RuntimeError("the sidecar did not start mirroring in 120 s")


def wait_drained(
    client: valkey.Valkey, stream: str, process: subprocess.Popen[bytes], timeout_s: float
) -> float:
    """Wait until the mirror has read and acked every entry; returns the seconds it took."""
    started = time.monotonic()
    state = group_state(client, stream)
    while time.monotonic() - started < timeout_s:
        if process.poll() is not None:
            raise RuntimeError(f"the sidecar exited with {process.returncode}")
        state = group_state(client, stream)
        if state == (0, 0):
            return time.monotonic() - started
        time.sleep(0.2)
    raise RuntimeError(f"not drained in {timeout_s:.0f} s: (lag, pending) = {state}")


def start_sidecar(
    stack: LocalStack, command: str, stream: str, log: Path, request_timeout_ms: int | None
) -> subprocess.Popen[bytes]:
    env = {
        **run_env(stack, stream, "bench-outage"),
        "MIRROR_PRIORITY_STREAMS": "none",
        "MIRROR_GROUP": GROUP,
        "MIRROR_BATCH": str(BATCH),
        # The topics are shared by the runs of one bench; each shadow sees only its own run.
        "SHADOW_START": "latest",
        "SIDECAR_METRICS_PORT": "0",
        "STATUS_INTERVAL_S": "10",
    }
    if request_timeout_ms is not None:
        env["KAFKA_REQUEST_TIMEOUT_MS"] = str(request_timeout_ms)
    return spawn_sidecar(command, env, log)


@dataclass
class Result:
    command: str
    before_kib: int
    outage_peak_kib: int
    catchup_peak_kib: int
    after_kib: int
    hwm_kib: int
    written: int
    in_kafka: int
    distinct: int
    exit_code: int
    drain_s: float
    behind_s: float
    load: str
    outage_s: float  # broker stopped to answering again
    outage_entries: int  # written meanwhile

    @property
    def ratio(self) -> float:
        return max(self.outage_peak_kib, self.catchup_peak_kib) / self.before_kib

    @property
    def ok(self) -> bool:
        return self.distinct == self.written and self.exit_code == 0


def outage_run(stack: LocalStack, command: str, args: argparse.Namespace, root: Path) -> Result:
    stream = f"bench.outage.{command}.{uuid.uuid4().hex[:6]}"
    total = args.rate * (args.warmup_s + args.outage_s + args.recovery_s + 60)
    payloads = [encode_task(task) for task in ragflow_tasks(min(total, 200_000))]
    client = valkey.Valkey.from_url(stack.valkey.url)
    log = root / f"sidecar-{command}.log"
    writer = Writer(stack.valkey.url, stream, args.rate, payloads)
    process = start_sidecar(stack, command, stream, log, args.request_timeout_ms)
    sampler = Sampler(process.pid)
    sampling = threading.Thread(target=sampler.run, name="rss", daemon=True)
    try:
        # The writer starts first; the stream exists once its first entry is in.
        writer.thread.start()
        wait_mirroring(client, stream, process, args.rate)
        sampling.start()
        print(f"[{command}] sidecar pid {process.pid} is mirroring; warm-up {args.warmup_s} s",
              flush=True)  # fmt: skip
        time.sleep(args.warmup_s)
        before = sampler.values("warmup")[-1]

        sampler.phase = "outage"
        stopped_at = time.monotonic()
        written_at_stop = writer.written
        stack.kafka.stop()
        print(f"[{command}] Kafka stopped ({time.monotonic() - stopped_at:.1f} s to stop); "
              f"outage {args.outage_s} s, writer at {args.rate}/s", flush=True)  # fmt: skip
        time.sleep(args.outage_s)
        if process.poll() is not None:
            raise RuntimeError(f"the sidecar exited during the outage ({process.returncode})")
        sampler.phase = "catchup"
        starting = time.monotonic()
        stack.kafka.start()
        outage_s = time.monotonic() - stopped_at
        outage_entries = writer.written - written_at_stop
        print(f"[{command}] Kafka back after {outage_s:.0f} s "
              f"({time.monotonic() - starting:.1f} s to start); writer goes on "
              f"{args.recovery_s} s", flush=True)  # fmt: skip
        time.sleep(args.recovery_s)
        written = writer.stop()
        drain_s = wait_drained(client, stream, process, timeout_s=300)
        sampler.phase = "after"
        time.sleep(5 * SAMPLE_S)  # a few samples at rest
        after = sampler.values("after")[-1]
        sampler.stop()
        sampling.join()
        exit_code = stop_sidecar(process)
        text = log.read_text(errors="replace")
        # Records that expire in a long outage make the broker refuse the old producer's
        # sequence numbers; the mirror then takes a new producer (sidecar/mirror/mirror.py).
        print(f"[{command}] producer replaced {text.count('a new producer')} times, "
              f"in-process restarts {text.count('starting again in')}", flush=True)  # fmt: skip
    except RuntimeError:
        print(f"[{command}] sidecar log tail:")
        print("\n".join(log.read_text(errors="replace").splitlines()[-30:]), flush=True)
        raise
    finally:
        writer.stop()
        sampler.stop()
        if process.poll() is None:
            stop_sidecar(process)
        client.close()
    if exit_code != 0:
        print(f"[{command}] sidecar exited with {exit_code}; log tail:")
        print("\n".join(log.read_text(errors="replace").splitlines()[-20:]))
    records, distinct = asyncio.run(count_in_kafka(stack.kafka.bootstrap_servers, stream))
    timeline = " ".join(f"{kib / 1024:.0f}" for _, _, kib in sampler.samples[:: max(1, 5)])
    print(f"[{command}] RSS every 5 s (MiB): {timeline}")
    return Result(
        command=command,
        before_kib=before,
        outage_peak_kib=max(sampler.values("outage")),
        catchup_peak_kib=max(sampler.values("catchup")),
        after_kib=after,
        hwm_kib=sampler.hwm_kib,
        written=written,
        in_kafka=records,
        distinct=distinct,
        exit_code=exit_code,
        drain_s=drain_s,
        behind_s=writer.behind_s,
        load=loadavg(),
        outage_s=outage_s,
        outage_entries=outage_entries,
    )


def report(result: Result, args: argparse.Namespace) -> None:
    print(f"[{result.command}] Kafka outage of {result.outage_s:.0f} s (stopped {args.outage_s} s "
          f"+ restart) at {args.rate} tasks/s (load average {result.load}):")  # fmt: skip
    print(f"  RSS before the outage   {mib(result.before_kib)}")
    print(f"  RSS peak, Kafka away    {mib(result.outage_peak_kib)}")
    print(f"  RSS peak, catching up   {mib(result.catchup_peak_kib)}")
    print(f"  RSS after recovery      {mib(result.after_kib)}  (VmHWM {mib(result.hwm_kib)})")
    print(f"  peak / before           {result.ratio:7.2f}")
    print(f"  bound: at most 2 x MIRROR_BATCH = {2 * BATCH} entries held; "
          f"{result.outage_entries:,} written during the outage waited in Valkey")  # fmt: skip
    print(f"  written {result.written:,}, in Kafka {result.in_kafka:,} records "
          f"({result.distinct:,} distinct entries, {result.in_kafka - result.distinct:,} "
          f"duplicates), drained {result.drain_s:.1f} s after the writer stopped, "
          f"writer at most {result.behind_s * 1000:.0f} ms behind schedule, "
          f"sidecar exit {result.exit_code}: {'ok' if result.ok else 'FAILED'}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--outage-s", type=int, default=60, help="Kafka down this long (60)")
    parser.add_argument("--rate", type=int, default=500, help="tasks XADDed per second (500)")
    parser.add_argument("--warmup-s", type=int, default=20, help="before the outage (20)")
    parser.add_argument("--recovery-s", type=int, default=20, help="writing after it (20)")
    # Kafka away longer than this: aiokafka expires the batch in hand, the mirror sends it
    # again, and when Kafka returns the idempotent producer meets OutOfOrderSequenceNumber and
    # the sidecar exits (docs/performance.md). A larger value measures memory past that.
    parser.add_argument(
        "--request-timeout-ms",
        type=int,
        help="KAFKA_REQUEST_TIMEOUT_MS for the sidecar (its default, 30000, unless given)",
    )
    parser.add_argument(
        "--command",
        nargs="+",
        choices=("mirror", "run"),
        default=["mirror", "run"],
        help="sidecar command(s) to measure, one run each (mirror run)",
    )
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="sidecar-bench-"))
    stack = bench_stack(root)
    print(f"load average at start {loadavg()}", flush=True)
    stack.up()
    try:
        asyncio.run(init_topics(Settings.from_env({
            "REDIS_URL": stack.valkey.url,
            "KAFKA_BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers,
        }).kafka))  # fmt: skip
        results = [outage_run(stack, command, args, root) for command in args.command]
        for result in results:
            report(result, args)
        return 0 if all(result.ok for result in results) else 1
    finally:
        stack.down()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
