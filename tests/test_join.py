"""The join's Lua on a real Valkey: a side's task bytes are kept only while the two sides' bytes
may differ, and handed to the judge only when they do (the payload comparator's diff)."""

from __future__ import annotations

import hashlib

import valkey.asyncio as avalkey

from sidecar.verdicts.join import Arrival, EntryRef, JoinStore, Side

TOKEN = "test@1"


def arrival(ref: EntryRef, side: Side, value: bytes, *, with_sha: bool = True) -> Arrival:
    sha = hashlib.sha256(value).hexdigest()
    return Arrival(
        ref,
        f'{{"side": "{side}", "value_sha": "{sha}"}}'.encode(),
        value,
        origin="t:0:1" if side == "kafka_run" else "",
        value_sha=sha if with_sha else "",
    )


async def join(
    store: JoinStore, ref: EntryRef, first: tuple[Side, bytes], second: tuple[Side, bytes]
) -> dict[str, bytes]:
    """Both sides recorded in turn; the fields the second one's decision was handed."""
    [(outcome, _)] = await store.record(first[0], [arrival(ref, *first)], TOKEN, 1)
    assert outcome == "recorded"
    [(outcome, fields)] = await store.record(second[0], [arrival(ref, *second)], TOKEN, 2)
    assert outcome == "decide"
    return fields


async def test_equal_task_bytes_are_dropped_once_both_sides_are_in(
    valkey_client: avalkey.Valkey, unique: str
) -> None:
    store = JoinStore(valkey_client, ttl_s=60)
    for n, order in enumerate((("redis_run", "kafka_run"), ("kafka_run", "redis_run"))):
        ref = EntryRef(f"te.{unique}.0", f"{n}-0")
        fields = await join(store, ref, (order[0], b'{"id": 1}'), (order[1], b'{"id": 1}'))
        assert set(fields) == {"redis_run", "kafka_run", "kafka_deliveries"}
        stored = await valkey_client.hgetall(ref.key)
        kept = {b"redis_run_value", b"kafka_run_value", b"redis_run_sha", b"kafka_run_sha"}
        assert not kept & set(stored), order
        assert stored[b"state"] == TOKEN.encode()


async def test_different_task_bytes_are_kept_and_handed_to_the_judge(
    valkey_client: avalkey.Valkey, unique: str
) -> None:
    store = JoinStore(valkey_client, ttl_s=60)
    ref = EntryRef(f"te.{unique}.0", "1-0")
    fields = await join(store, ref, ("redis_run", b'{"id": 1}'), ("kafka_run", b'{"id": 2}'))
    assert fields["redis_run_value"] == b'{"id": 1}'
    assert fields["kafka_run_value"] == b'{"id": 2}'
    # Kept until the verdict is published (the sweeper may have to decide it again).
    assert await valkey_client.hget(ref.key, "kafka_run_value") == b'{"id": 2}'
    assert await store.finish([(ref, TOKEN, "mismatch", "final")]) == [True]
    stored = await valkey_client.hgetall(ref.key)
    assert not {b"redis_run_value", b"kafka_run_value", b"redis_run_sha"} & set(stored)
    assert stored[b"state"] == b"done"


async def test_a_side_without_a_digest_keeps_both_values(
    valkey_client: avalkey.Valkey, unique: str
) -> None:
    """An arrival from a build that sent no SHA (a rolling upgrade) cannot be matched by it."""
    store = JoinStore(valkey_client, ttl_s=60)
    ref = EntryRef(f"te.{unique}.0", "1-0")
    await store.record("redis_run", [arrival(ref, "redis_run", b"x", with_sha=False)], TOKEN, 1)
    [(outcome, fields)] = await store.record(
        "kafka_run", [arrival(ref, "kafka_run", b"x")], TOKEN, 2
    )
    assert outcome == "decide"
    assert fields["redis_run_value"] == fields["kafka_run_value"] == b"x"
