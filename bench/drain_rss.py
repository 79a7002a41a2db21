"""Sidecar memory (RSS) while ``run`` drains a backlog of RAGFlow tasks to their verdicts.

On a local stack of its own (real Valkey and Kafka on free ports, Valkey without ``maxmemory``:
the bench checks), the bench XADDs ``--tasks`` RAGFlow-shaped tasks (default 1,000,000;
``sidecar.dev.samples.ragflow_tasks``, all five kinds), one in ten on ``te.1.common`` and the
rest on ``te.0.common``, with RAGFlow's group (``rag_flow_svr_task_broker``) created on both
first. Only then does it start the real ``ragflow-sidecar run`` (mirror from the streams' start,
redis run, shadow consumer, observer, judge; the dry-run handler, ``MAX_CONCURRENT_TASKS`` 50,
as ``e2e_latency.py``) as a subprocess. A RAGFlow-like worker in this process takes
``--worker-rate`` entries a second in RAGFlow's group (XREADGROUP, XACK a tick later), so the
observer has deliveries to watch and report into the join; 0 leaves the group idle.

Every second: the sidecar's VmRSS (``/proc/<pid>/status``), the judge's verdict tally (the
``ragflow_sidecar:verdicts:counts`` hash in the state store, what ``status`` prints; no verdict
record is read) and Valkey's ``INFO memory`` ``used_memory``, until every task has a final
verdict. Printed: RSS at start (the first sample once ``/readyz`` answers), peak, peak/start and
at the end; ``used_memory`` before the backlog, with it, at its peak and at the end; verdicts/s
from ready to the last verdict, and the verdicts by kind.

Exit 1 unless every task has exactly one final verdict (their sum is ``--tasks``, the join's
index of open entries is empty), the sidecar exits 0 on SIGTERM, and RSS stays bounded:

- peak/start at most ``--max-ratio`` (3.0), the peak being the larger of the sampled one and
  the kernel's VmHWM. Not the ~1.1 of ``outage_rss.py``, whose start is a sidecar already
  warm: besides the two mirror batches, ``MAX_CONCURRENT_TASKS`` and the observer's tracking
  (at most 100,000 entries; a handful here), ``run`` fills windows of a fixed size as it goes:
  the shadow consumer's last 100,000 order keys (``comparators.ordering.OrderTracker``; every
  task of a document of its own is a new key, ~0.5 KB each, ~50 MiB when full) and the mirror's
  last 100,000 latencies (``MirrorStats.latency_ms``, ~4 MiB); with Kafka's fetch buffers and
  the allocator's, RSS goes from ~60 MiB at start to ~150 MiB over the first ~250,000 tasks
  and stays there (2.5x; measured on 1,000,000, docs/performance.md).
- from 400,000 tasks on (far past those windows' 100,000), the peak of the second half of the
  verdicts at most 1.1 x RSS at half of them: a leak grows with the tasks there, a window does
  not. Printed for smaller runs, not checked.

A backlog held in the process would grow with ``--tasks`` past both (1,000,000 tasks of ~383
bytes of JSON are ~2 GiB as Python objects).

Resources for 1,000,000 tasks (measured): Valkey's ``used_memory`` reaches 2.6 GB (the stream,
~0.4 GB, and, as the state store, each judged task's join hash and dedup key for 1 h, ~2.2 KB a
task; RSS a little more), Kafka's log takes 0.23 GB of disk under the temporary directory, with
Kafka's 768 MiB heap and the sidecar's ~150 MiB: run it with 4 GB of free RAM and 1 GB of
free disk. It took 18 minutes on 2 busy CPUs (41 s to XADD, then ~1,000 verdicts/s).

Usage: .venv/bin/python bench/drain_rss.py [--tasks 1000000] [--worker-rate 100]
       [--concurrency 50] [--max-ratio 3.0] [--stall-s 600]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import valkey
from bench_common import (
    bench_stack,
    fill,
    free_port,
    loadavg,
    mib,
    rss_kib,
    run_env,
    spawn_sidecar,
    stop_sidecar,
    wait_ready,
)

from sidecar.config import Settings
from sidecar.dev.local_stack import LocalStack
from sidecar.observer.observer import RAGFLOW_GROUP
from sidecar.transport.topics import init_topics
from sidecar.verdicts.join import OPEN_KEY
from sidecar.verdicts.model import VERDICT_COUNTS_KEY

STREAMS = ("te.1.common", "te.0.common")  # RAGFlow's, priority first, as in production
SAMPLE_S = 1.0
# The windows that fill as ``run`` goes hold 100,000 each: the second half of a run this long
# starts far past them, so RSS must stay flat there.
PLATEAU_FROM_TASKS = 400_000
MAX_SECOND_HALF_GROWTH = 1.1


@dataclass(frozen=True)
class Sample:
    at_s: float  # since the sidecar was ready
    rss_kib: int
    verdicts: int  # final ones (a duplicate verdict is a second one for its entry)
    used_memory: int


@dataclass(frozen=True)
class Outcome:
    """What is known once every verdict is in and the sidecar has stopped."""

    counts: dict[str, int]  # the judge's tally by kind
    open_entries: int  # the join's index of entries still waiting for a verdict
    taken: int  # by RAGFlow's worker
    exit_code: int
    hwm_kib: int  # VmHWM, the kernel's own peak RSS
    empty_memory: int  # used_memory before the backlog
    disk: int  # bytes under the stack's directory (Kafka's log)


def final_verdicts(counts: dict[bytes, bytes]) -> int:
    return sum(int(n) for kind, n in counts.items() if kind != b"duplicate")


def used_memory(client: valkey.Valkey) -> int:
    return int(client.info("memory")["used_memory"])


def disk_bytes(root: Path) -> int:
    """Bytes allocated under ``root`` (Kafka preallocates sparse index files: not counted)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):  # a segment Kafka deleted meanwhile
                total += os.stat(os.path.join(folder, name)).st_blocks * 512
    return total


class RagflowWorker:
    """RAGFlow's executors at ``rate`` entries a second: a batch read in RAGFlow's group every
    0.1 s, priority stream first, acked at the next tick (so some are pending when looked at)."""

    def __init__(self, url: str, rate: int) -> None:
        self.url, self.rate = url, rate
        self.taken = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ragflow-worker", daemon=True)

    def _run(self) -> None:
        client = valkey.Valkey.from_url(self.url)
        held: list[tuple[str, bytes]] = []
        started = time.monotonic()
        try:
            while not self._stop.wait(0.1):
                for stream in {stream for stream, _ in held}:
                    client.xack(stream, RAGFLOW_GROUP, *[i for s, i in held if s == stream])
                held = []
                due = int((time.monotonic() - started) * self.rate) - self.taken
                for stream in STREAMS:
                    if due <= 0:
                        break
                    reply = client.xreadgroup(
                        RAGFLOW_GROUP, "task_executor_0", {stream: ">"}, count=due
                    )
                    for _, entries in reply or []:
                        held.extend((stream, entry_id) for entry_id, _ in entries)
                        self.taken += len(entries)
                        due -= len(entries)
        finally:
            client.close()

    def stop(self) -> int:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join()
        return self.taken


def start_sidecar(
    stack: LocalStack, port: int, log: Path, concurrency: int
) -> subprocess.Popen[bytes]:
    env = {
        **run_env(stack, ",".join(STREAMS), "bench-drain"),
        "SIDECAR_METRICS_HOST": "127.0.0.1",
        "SIDECAR_METRICS_PORT": str(port),
        "STATUS_INTERVAL_S": "60",
        "MAX_CONCURRENT_TASKS": str(concurrency),
    }
    return spawn_sidecar("run", env, log)


def drain(
    client: valkey.Valkey, process: subprocess.Popen[bytes], total: int, stall_s: float
) -> list[Sample]:
    """Sample every second until ``total`` final verdicts; fails if the sidecar exits or no
    verdict comes for ``stall_s``."""
    samples: list[Sample] = []
    started = time.monotonic()
    moved_at, last = started, -1
    while True:
        reading = rss_kib(process.pid)
        if reading is None or process.poll() is not None:
            raise RuntimeError(f"the sidecar exited with {process.poll()}")
        verdicts = final_verdicts(client.hgetall(VERDICT_COUNTS_KEY))
        now = time.monotonic()
        samples.append(Sample(now - started, reading[0], verdicts, used_memory(client)))
        if verdicts >= total:
            return samples
        if verdicts != last:
            moved_at, last = now, verdicts
        elif now - moved_at > stall_s:
            raise RuntimeError(f"no verdict for {stall_s:.0f} s at {verdicts:,} of {total:,}")
        if len(samples) % 60 == 0:
            rate = verdicts / max(now - started, 1e-9)
            print(f"  {now - started:6.0f} s: {verdicts:,} verdicts ({rate:,.0f}/s), RSS "
                  f"{mib(reading[0])}, used_memory {samples[-1].used_memory / 2**20:,.0f} MiB, "
                  f"load {loadavg()}", flush=True)  # fmt: skip
        time.sleep(SAMPLE_S)


def check_no_maxmemory(client: valkey.Valkey) -> None:
    """A ``maxmemory`` would make the state store refuse writes (``noeviction``) or evict join
    hashes mid-run; the local stack sets none, and this says so if that changes."""
    limit = int(client.config_get("maxmemory")["maxmemory"])
    if limit:
        raise RuntimeError(f"Valkey has maxmemory {limit}; the bench needs none")


def report(args: argparse.Namespace, samples: list[Sample], out: Outcome) -> bool:
    start, end = samples[0], samples[-1]
    peak = max(samples, key=lambda s: s.rss_kib)
    ratio = max(peak.rss_kib, out.hwm_kib) / start.rss_kib
    half = next(s for s in samples if s.verdicts >= args.tasks // 2)
    growth = max(s.rss_kib for s in samples if s.at_s >= half.at_s) / half.rss_kib
    plateau_checked = args.tasks >= PLATEAU_FROM_TASKS
    peak_mem = max(s.used_memory for s in samples)
    final = sum(n for kind, n in out.counts.items() if kind != "duplicate")
    step = max(1, len(samples) // 20)
    timeline = " ".join(f"{s.rss_kib / 1024:.0f}" for s in samples[::step])
    print(f"drain of {args.tasks:,} tasks by `ragflow-sidecar run` (MAX_CONCURRENT_TASKS "
          f"{args.concurrency}, RAGFlow's worker at {args.worker_rate}/s):")  # fmt: skip
    print(f"  RSS every {step} s (MiB): {timeline}")
    print(f"  RSS at start            {mib(start.rss_kib)}  (first sample after /readyz)")
    print(f"  RSS peak                {mib(peak.rss_kib)}  at {peak.at_s:.0f} s, "
          f"{peak.verdicts:,} verdicts in (VmHWM {mib(out.hwm_kib)})")  # fmt: skip
    print(f"  RSS at half the verdicts{mib(half.rss_kib)}  at {half.at_s:.0f} s")
    print(f"  RSS at the end          {mib(end.rss_kib)}")
    print(f"  peak / start            {ratio:7.2f}  (the larger peak; bound {args.max_ratio})")
    unchecked = "" if plateau_checked else f", checked from {PLATEAU_FROM_TASKS:,} tasks"
    print(f"  second half / half      {growth:7.2f}  (bound {MAX_SECOND_HALF_GROWTH}{unchecked})")
    print(f"  Valkey used_memory: empty {out.empty_memory:,}, at start (the backlog in) "
          f"{start.used_memory:,}, peak {peak_mem:,}, end {end.used_memory:,} bytes "
          f"((end - start) / task {(end.used_memory - start.used_memory) / args.tasks:,.0f}"
          f" B); disk under the stack {out.disk:,} bytes")  # fmt: skip
    print(f"  verdicts {out.counts}: {final:,} final of {args.tasks:,} in {end.at_s:,.0f} s "
          f"({final / end.at_s:,.0f}/s from ready to the last); open entries "
          f"{out.open_entries}; RAGFlow's worker took {out.taken:,}; "
          f"sidecar exit {out.exit_code}")  # fmt: skip
    ok = (
        final == args.tasks
        and out.open_entries == 0
        and out.exit_code == 0
        and ratio <= args.max_ratio
        and (growth <= MAX_SECOND_HALF_GROWTH or not plateau_checked)
    )
    print("ok" if ok else "FAILED: every task one final verdict, none open, exit 0 and RSS "
          "within the bounds expected")  # fmt: skip
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=1_000_000, help="backlog (1,000,000)")
    parser.add_argument(
        "--worker-rate", type=int, default=100, help="RAGFlow's worker, entries/s (100; 0: none)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=50, help="the shadow's MAX_CONCURRENT_TASKS (50)"
    )
    parser.add_argument("--max-ratio", type=float, default=3.0, help="peak/start RSS (3.0)")
    parser.add_argument("--stall-s", type=float, default=600, help="longest wait for a verdict")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="sidecar-bench-"))
    stack = bench_stack(root)
    print(f"load average at start {loadavg()}", flush=True)
    stack.up()
    process: subprocess.Popen[bytes] | None = None
    worker = RagflowWorker(stack.valkey.url, args.worker_rate)
    log = root / "sidecar.log"
    client = valkey.Valkey.from_url(stack.valkey.url)
    try:
        check_no_maxmemory(client)
        asyncio.run(init_topics(Settings.from_env({
            "REDIS_URL": stack.valkey.url,
            "KAFKA_BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers,
        }).kafka))  # fmt: skip
        empty = used_memory(client)
        filling = time.monotonic()
        priority = args.tasks // 10
        for stream in STREAMS:
            client.xgroup_create(stream, RAGFLOW_GROUP, id="0", mkstream=True)
        fill(stack.valkey.url, STREAMS[0], priority)
        fill(stack.valkey.url, STREAMS[1], args.tasks - priority)
        print(f"backlog of {args.tasks:,} XADDed in {time.monotonic() - filling:.0f} s; "
              f"used_memory {used_memory(client):,}; load {loadavg()}", flush=True)  # fmt: skip
        port = free_port()
        process = start_sidecar(stack, port, log, args.concurrency)
        wait_ready(port, process)
        if args.worker_rate > 0:
            worker.thread.start()
        samples = drain(client, process, args.tasks, args.stall_s)
        hwm = (rss_kib(process.pid) or (0, 0))[1]
        taken = worker.stop()
        exit_code = stop_sidecar(process)
        counts = {k.decode(): int(v) for k, v in client.hgetall(VERDICT_COUNTS_KEY).items()}
        outcome = Outcome(
            counts, int(client.zcard(OPEN_KEY)), taken, exit_code, hwm, empty, disk_bytes(root)
        )
        ok = report(args, samples, outcome)
        if exit_code != 0:
            print("sidecar log tail:")
            print("\n".join(log.read_text(errors="replace").splitlines()[-20:]))
        return 0 if ok else 1
    except RuntimeError:
        print("sidecar log tail:")
        print("\n".join(log.read_text(errors="replace").splitlines()[-30:]), flush=True)
        raise
    finally:
        worker.stop()
        if process is not None and process.poll() is None:
            stop_sidecar(process)
        client.close()
        stack.down()
        shutil.rmtree(root, ignore_errors=True)
        print(f"load average at end {loadavg()}")


if __name__ == "__main__":
    raise SystemExit(main())
