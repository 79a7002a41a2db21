"""`make demo`'s live line: the count of tasks RAGFlow's stand-in producer has queued so far."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import valkey.asyncio as avalkey

from sidecar.dev.demo import BROKEN_ENTRIES, STREAMS, _produce, _Summary
from sidecar.dev.local_stack.valkey import LocalValkey
from tests.conftest import free_port
from tests.ragflow_support import wait_until


@pytest.mark.servers
async def test_the_live_line_counts_what_is_produced_while_it_is_produced(tmp_path: Path) -> None:
    server = LocalValkey(tmp_path / "valkey", free_port())
    server.start()
    client = avalkey.Valkey.from_url(server.url)
    try:
        summary = _Summary(0)
        tasks = [{"id": f"t{n}", "doc_id": f"d{n % 7}"} for n in range(100)]
        # At 50/s the producer takes 2 s at least: the count must move before it ends (the
        # line read 0 until the producer had finished).
        producer = asyncio.create_task(_produce(client, tasks, 50, summary))
        await wait_until(lambda: summary.produced > 0 or producer.done(), 30, what="the first XADD")
        assert not producer.done() and 0 < summary.produced < len(tasks)
        await producer
        assert summary.produced == len(tasks) + len(BROKEN_ENTRIES)
        assert sum([await client.xlen(stream) for stream in STREAMS]) == summary.produced
    finally:
        await client.aclose()
        server.stop()
        shutil.rmtree(tmp_path / "valkey", ignore_errors=True)
