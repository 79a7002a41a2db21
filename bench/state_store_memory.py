"""State store memory: the bytes the sidecar keeps in SIDECAR_STATE_URL per task, in flight and
once judged, to size a Valkey of its own (docs/operations.md, "The state store").

On a local stack of its own plus a separate, empty state store (a second Valkey):

1. ``--tasks`` RAGFlow-shaped tasks of all five kinds are XADDed to ``te.0.common``, and RAGFlow's
   worker (XREADGROUP + XACK in RAGFlow's group) takes them while ``mirror --compare`` and the
   observer run: each entry's join hash then holds its redis run (facts and the task's bytes) and
   RAGFlow's delivery, and the index of open entries a member. That is a task **in flight**:
   waiting for its kafka run (a shadow consumer behind the mirror).
2. The shadow consumer and the judge then run alone until every entry has its verdict: the hash
   holds both runs' facts (the task bytes are dropped at the verdict) for 1 h, the dedup key
   stays for ``SHADOW_DEDUP_TTL_S`` (1 day), the entry leaves the index. That is a task
   **judged**. An hour on, the hash has expired (the bench deletes it) and the dedup key is
   what is left of the task until its day is out.

``used_memory`` (what ``maxmemory`` is compared with) is read with the sidecar stopped,
before and after each phase; ``MEMORY USAGE ... SAMPLES 0`` of single keys backs the totals up.

Usage: .venv/bin/python bench/state_store_memory.py [--tasks 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import valkey
import valkey.asyncio as avalkey
from bench_common import bench_stack, fill, free_port, loadavg, whole_sidecar_settings

from sidecar.app.service import Sidecar
from sidecar.config import Settings
from sidecar.dev.local_stack import LocalValkey
from sidecar.shadow.handlers import load_handler
from sidecar.transport.topics import init_topics
from sidecar.verdicts.join import JOIN_PREFIX, OPEN_KEY, SEEN_PREFIX
from sidecar.verdicts.model import VERDICT_COUNTS_KEY

STREAM = "te.0.common"
RAGFLOW_GROUP = "rag_flow_svr_task_broker"


def used_memory(client: valkey.Valkey) -> int:
    info = client.info("memory")
    print(
        f"  used_memory {info['used_memory']}, of which dataset {info['used_memory_dataset']}, "
        f"overhead {info['used_memory_overhead']}, scripts {info.get('used_memory_scripts')}",
        flush=True,
    )
    return int(info["used_memory"])


def usage(client: valkey.Valkey, keys: list[bytes]) -> float:
    """Mean MEMORY USAGE (every element counted) of ``keys``."""
    return statistics.fmean(int(client.memory_usage(key, samples=0) or 0) for key in keys)


async def run_until(
    sidecar: Sidecar,
    done: Callable[[], bool],
    started: Callable[[], object] = lambda: None,
    timeout_s: float = 600.0,
) -> None:
    """Run ``sidecar`` until ``done()`` (polled) holds, then stop it gracefully; ``started()``
    is called once it has started."""
    stop = asyncio.Event()
    async with sidecar:
        loops = asyncio.create_task(sidecar.run(stop))
        started()
        try:
            async with asyncio.timeout(timeout_s):
                while not done():
                    if loops.done():
                        loops.result()
                    await asyncio.sleep(0.2)
        finally:
            stop.set()
            await asyncio.wait_for(loops, timeout=60)


async def ragflow_worker(url: str, total: int) -> None:
    """RAGFlow's executor: every entry read in RAGFlow's group and acked."""
    client = avalkey.Valkey.from_url(url)
    taken = 0
    try:
        while taken < total:
            reply = await client.xreadgroup(
                RAGFLOW_GROUP, "task_executor_0", {STREAM: ">"}, count=50, block=100
            )
            for _, entries in reply or []:
                ids = [entry_id for entry_id, _ in entries]
                taken += len(ids)
                await client.xack(STREAM, RAGFLOW_GROUP, *ids)
    finally:
        await client.aclose()


async def measure(settings: Settings, state: valkey.Valkey, url: str, total: int) -> bool:
    """Print the table; whether every task got a ``match`` verdict (the bench's check)."""
    baseline = used_memory(state)
    handler = load_handler(settings.shadow.handler)

    # 1. In flight: redis runs and RAGFlow's deliveries, no kafka run yet.
    # RAGFlow's worker starts once the observer has taken its baseline (what was acked before
    # is not reported).
    workers: list[asyncio.Task[None]] = []
    hashes: list[bytes] = []

    def all_in_flight() -> bool:
        """Every entry open, with its redis run and RAGFlow's delivery."""
        if state.zcard(OPEN_KEY) < total or not all(w.done() for w in workers):
            return False
        if not hashes:
            hashes.extend(state.scan_iter(match=f"{JOIN_PREFIX}{STREAM}:*", count=1000))
        pipe = state.pipeline(transaction=False)
        for key in hashes:
            pipe.hexists(key, "worker")
        return all(pipe.execute())

    await run_until(
        Sidecar(settings, handler=handler, shadow=False),
        all_in_flight,
        started=lambda: workers.append(asyncio.create_task(ragflow_worker(url, total))),
    )
    await asyncio.gather(*workers)
    assert len(hashes) == total, len(hashes)
    in_flight = used_memory(state)
    in_flight_hash = usage(state, hashes)
    open_index = int(state.memory_usage(OPEN_KEY, samples=0) or 0)

    # 2. Judged: the shadow and the judge alone (the sweeper decides nothing here: the compare
    # timeout is far off).
    def all_judged() -> bool:
        counts = state.hgetall(VERDICT_COUNTS_KEY)
        return sum(int(n) for n in counts.values()) >= total

    await run_until(Sidecar(settings, handler=handler, mirror=False, observer=False), all_judged)
    judged = used_memory(state)
    seen = list(state.scan_iter(match=f"{SEEN_PREFIX}{STREAM}:*", count=1000))
    judged_hash = usage(state, hashes)
    seen_key = usage(state, seen)
    counts = {k.decode(): int(v) for k, v in state.hgetall(VERDICT_COUNTS_KEY).items()}
    # 3. An hour on: the decided hashes have expired (deleted here), the dedup keys remain.
    for start in range(0, len(hashes), 1000):
        state.delete(*hashes[start : start + 1000])
    dedup_only = used_memory(state)

    task_bytes = statistics.fmean(len(fields[b"message"]) for _, fields in entries(url, total))
    print(f"tasks {total}, mean task JSON {task_bytes:.0f} bytes, verdicts {counts}")
    print(
        f"used_memory: empty {baseline}, in flight {in_flight}, judged {judged}, "
        f"an hour on {dedup_only} bytes"
    )
    print("| per task | used_memory delta | MEMORY USAGE of its keys |")
    print("| --- | --- | --- |")
    flight_delta, judged_delta = (in_flight - baseline) / total, (judged - baseline) / total
    print(
        f"| in flight (redis run + RAGFlow's delivery, open) | {flight_delta:.0f} "
        f"| join hash {in_flight_hash:.0f} + index member {open_index / total:.0f} |"
    )
    print(
        f"| judged, first hour (both runs' facts + dedup key) | {judged_delta:.0f} "
        f"| join hash {judged_hash:.0f} + dedup key {seen_key:.0f} |"
    )
    print(
        f"| judged, after the hour until the day is out (dedup key) "
        f"| {(dedup_only - baseline) / total:.0f} | dedup key {seen_key:.0f} |"
    )
    return counts == {"match": total}


def entries(url: str, total: int) -> list[tuple[bytes, dict[bytes, bytes]]]:
    client = valkey.Valkey.from_url(url)
    try:
        return list(client.xrange(STREAM, count=total))
    finally:
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=5000, help="tasks to measure (5000)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sidecar-bench-"))
    stack = bench_stack(root)
    store = LocalValkey(root / "state", free_port())
    print(f"load average at start {loadavg()}", flush=True)
    stack.up()
    store.start()
    state = valkey.Valkey(host="127.0.0.1", port=store.port, db=0)
    try:
        settings = whole_sidecar_settings(
            stack,
            STREAM,
            "statemem",
            SIDECAR_STATE_URL=f"redis://127.0.0.1:{store.port}/0",
            SHADOW_START="earliest",  # the stack's topics hold this run's records only
            MAX_CONCURRENT_TASKS="50",
            OBSERVER_INTERVAL_MS="100",
        )
        asyncio.run(init_topics(settings.kafka))
        source = valkey.Valkey.from_url(stack.valkey.url)
        source.xgroup_create(STREAM, RAGFLOW_GROUP, id="0", mkstream=True)
        source.close()
        fill(stack.valkey.url, STREAM, args.tasks)
        ok = asyncio.run(measure(settings, state, stack.valkey.url, args.tasks))
    finally:
        with contextlib.suppress(Exception):
            state.close()
        store.stop()
        stack.down()
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average at end {loadavg()}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
