"""Order is judged only where it is promised: one stream's entries of one key, in one partition.

A document's tasks of several kinds go to several topics, and RAGFlow puts them on two streams
whose entry ids do not compare; nobody promises an order across those, so a clean run of such a
workload must give nothing but ``match``. Entries the mirror really reorders within a partition
still give ``mismatch``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.transport.base import OutgoingMessage
from sidecar.transport.message import QueueMessage
from sidecar.transport.topics import init_topics
from tests.mirror_support import RAGFLOW_GROUP, ragflow_worker
from tests.shadow_handlers import SLOW_FIRST_KAFKA_RUN
from tests.shadow_support import read_verdicts, running_sidecar, sidecar_settings
from tests.test_shadow import enqueue, finals


def _document_tasks(doc: str, memory: str, round_: int) -> list[tuple[int, dict[str, Any]]]:
    """(priority, task) of one round of a document: all five kinds, both priorities."""

    def task(**fields: Any) -> dict[str, Any]:
        return {"id": uuid.uuid1().hex, "digest": f"r{round_}", **fields}

    page = 12 * round_
    return [
        (1, task(doc_id=doc, from_page=page, to_page=page + 12, priority=1)),
        (0, task(doc_id=doc, from_page=page + 6, to_page=page + 12, priority=0)),
        (0, task(doc_id=doc, task_type="dataflow", kb_id="kb1", tenant_id="t1", file=None)),
        (1, task(doc_id=doc, task_type="dataflow", kb_id="kb1", tenant_id="t1", file=None)),
        (0, task(doc_id=doc, task_type="raptor", from_page=100000000, doc_ids=[doc])),
        (1, task(doc_id=doc, task_type="raptor", from_page=100000000, doc_ids=[doc])),
        (0, task(task_type="memory", memory_id=memory, tenant_id="t1", message_dict={})),
        (1, task(task_type="memory", memory_id=memory, tenant_id="t1", message_dict={})),
        (0, task(doc_id="graph_raptor_x", task_type="graphrag", doc_ids=[doc])),
    ]


async def _run(
    settings: Settings,
    client: avalkey.Valkey,
    unique: str,
    transform: Any = None,
    handler: str = "noop",
) -> tuple[dict[tuple[str, str], dict[str, Any]], dict[tuple[str, str], str]]:
    await init_topics(settings.kafka)
    high, low = f"{unique}.1", f"{unique}.0"
    streams = {1: high, 0: low}
    docs = [uuid.uuid1().hex for _ in range(6)]
    entries: dict[tuple[str, str], str] = {}  # (stream, entry id) -> task id
    for round_ in range(3):
        for n, doc in enumerate(docs):
            for priority, task in _document_tasks(doc, f"mem{unique}{n % 2}", round_):
                [entry_id] = await enqueue(client, streams[priority], [task])
                entries[streams[priority], entry_id] = task["id"]
    for stream in (high, low):
        await client.xgroup_create(stream, RAGFLOW_GROUP, id="0")
    counts = Counter(
        streams[p] for _ in range(3) for _ in docs for p, _ in _document_tasks("d", "m", 0)
    )
    config = sidecar_settings(settings, [high, low], unique, SHADOW_HANDLER=handler)
    async with running_sidecar(config, transform=transform):
        await asyncio.gather(
            ragflow_worker(client, high, counts[high]), ragflow_worker(client, low, counts[low])
        )
        verdicts = await read_verdicts(settings, {high, low}, expected=len(entries))
    return finals(verdicts), entries


async def test_a_mixed_workload_of_every_kind_and_both_priorities_is_all_match(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    by_entry, entries = await _run(settings, valkey_client, unique)
    assert len(by_entry) == len(entries) == 162
    kinds = Counter(v["verdict"] for v in by_entry.values())
    orders = [v for v in by_entry.values() if "order" in str(v.get("differences"))]
    assert kinds == {"match": 162}, (kinds, orders[:3])


async def test_entries_reordered_within_a_partition_are_a_mismatch(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    held: dict[str, OutgoingMessage] = {}
    swapped: list[str] = []

    def swap_first_two_parse_tasks(
        message: QueueMessage, record: OutgoingMessage
    ) -> list[OutgoingMessage]:
        """The first low-priority parse task of a document is held back and sent after the
        document's next one: same stream, same key, so the same partition, reversed."""
        task_type = dict(record.headers).get("x-task-type")
        if message.topic != f"{unique}.0" or task_type != b"parse" or len(swapped) >= 2:
            return [record]
        key = str(record.key)
        if key not in held and not swapped:
            held[key] = record
            swapped.append(message.id)
            return []
        if key in held:
            swapped.append(message.id)
            return [record, held.pop(key)]
        return [record]

    by_entry, _ = await _run(settings, valkey_client, unique, swap_first_two_parse_tasks)
    first, second = swapped
    late = by_entry[f"{unique}.0", first]
    assert late["verdict"] == "mismatch", late
    assert "order" in str(late["differences"]), late
    others = Counter(v["verdict"] for k, v in by_entry.items() if k != (f"{unique}.0", first))
    assert others == {"match": 161}, others
    assert by_entry[f"{unique}.0", second]["verdict"] == "match"


async def test_a_second_copy_of_an_entry_in_hand_is_not_an_order_mismatch(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    """A replay read right behind the first copy: Kafka holds e1, e2, e1 for one key. Both
    copies of e1 are processed (the first is still in hand), and the join keeps the one
    recorded first: the copy, whose handler is quick. It comes after e2 by nature, which is
    not the mirror reordering anything."""
    copied: list[str] = []
    first: dict[str, OutgoingMessage] = {}

    def copy_after_the_next(
        message: QueueMessage, record: OutgoingMessage
    ) -> list[OutgoingMessage]:
        task_type = dict(record.headers).get("x-task-type")
        if message.topic != f"{unique}.0" or task_type != b"parse" or len(copied) >= 2:
            return [record]
        key = str(record.key)
        if not copied:
            first[key] = record
            copied.append(message.id)
            SLOW_FIRST_KAFKA_RUN.add(dict(record.headers)["x-task-id"].decode())
            return [record]
        if key in first:
            copied.append(message.id)
            return [record, first.pop(key)]
        return [record]

    by_entry, _ = await _run(
        settings,
        valkey_client,
        unique,
        copy_after_the_next,
        handler="tests.shadow_handlers:slow_first_kafka_run",
    )
    assert len(copied) == 2 and not SLOW_FIRST_KAFKA_RUN  # the copy was made and run
    copy = by_entry[f"{unique}.0", copied[0]]
    assert copy["verdict"] == "match", copy
    assert Counter(v["verdict"] for v in by_entry.values()) == {"match": 162}


def _swap_first_two_parse_tasks(unique: str, swapped: list[str], relabel: Any) -> Any:
    """As in the test above, the held-back record passed through ``relabel`` when it is sent."""
    held: dict[str, OutgoingMessage] = {}

    def transform(message: QueueMessage, record: OutgoingMessage) -> list[OutgoingMessage]:
        task_type = dict(record.headers).get("x-task-type")
        if message.topic != f"{unique}.0" or task_type != b"parse" or len(swapped) >= 2:
            return [record]
        key = str(record.key)
        if key not in held and not swapped:
            held[key] = record
            swapped.append(message.id)
            return []
        if key in held:
            swapped.append(message.id)
            return [record, relabel(held.pop(key))]
        return [record]

    return transform


def _with_headers(record: OutgoingMessage, **changed: bytes) -> OutgoingMessage:
    names = {name.replace("_", "-") for name in changed}
    headers = [(n, v) for n, v in record.headers if n not in names]
    headers += [(name.replace("_", "-"), value) for name, value in changed.items()]
    return record._replace(headers=tuple(headers))


async def test_entries_of_one_document_sent_by_two_mirrors_are_not_judged_against_each_other(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    # Two mirror replicas in one group each read part of a stream: a document's entries can
    # reach its partition out of stream order between them, which no one promised.
    swapped: list[str] = []
    other = _swap_first_two_parse_tasks(
        unique, swapped, lambda r: _with_headers(r, x_mirror_consumer=b"mirror-b")
    )
    by_entry, _ = await _run(settings, valkey_client, unique, other)
    assert len(swapped) == 2
    kinds = Counter(v["verdict"] for v in by_entry.values())
    assert kinds == {"match": 162}, kinds


async def test_an_entry_taken_over_from_a_dead_mirror_is_not_judged_for_order(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    # The same mirror, but the late entry was taken over (XAUTOCLAIM) from a dead one: sent
    # after newer entries by nature.
    swapped: list[str] = []
    claimed = _swap_first_two_parse_tasks(
        unique, swapped, lambda r: _with_headers(r, x_mirror_claimed=b"1")
    )
    by_entry, _ = await _run(settings, valkey_client, unique, claimed)
    assert len(swapped) == 2
    kinds = Counter(v["verdict"] for v in by_entry.values())
    assert kinds == {"match": 162}, kinds
