"""The join's coalescer: concurrent calls become one batched call, each caller gets its own."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.transport.coalesce import Coalescer


class Recorder:
    """A batched call that records its batches and can be held open or made to fail."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_with: Exception | None = None
        self.called = asyncio.Event()

    async def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(items)
        self.called.set()
        await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        return [item * 10 for item in items]


async def test_calls_in_one_turn_are_one_call_and_each_gets_its_own() -> None:
    call = Recorder()
    coalescer = Coalescer(call, max_items=100)
    results = await asyncio.gather(*(coalescer.submit([i, i + 100]) for i in range(5)))
    assert results == [[i * 10, (i + 100) * 10] for i in range(5)]
    assert len(call.batches) == 1 and sorted(call.batches[0]) == sorted(
        [i for n in range(5) for i in (n, n + 100)]
    )
    assert (coalescer.batches, coalescer.items) == (1, 10)


async def test_calls_while_a_batch_is_in_flight_form_the_next_batch() -> None:
    call = Recorder()
    call.gate.clear()
    coalescer = Coalescer(call, max_items=100)
    first = asyncio.create_task(coalescer.submit([1]))
    await call.called.wait()
    later = [asyncio.create_task(coalescer.submit([n])) for n in (2, 3, 4)]
    await asyncio.sleep(0)
    assert call.batches == [[1]]  # the others wait for the call in flight
    call.gate.set()
    assert await first == [10]
    assert [await task for task in later] == [[20], [30], [40]]
    assert call.batches == [[1], [2, 3, 4]]


async def test_a_batch_holds_at_most_max_items_and_never_splits_a_caller() -> None:
    call = Recorder()
    coalescer = Coalescer(call, max_items=4)
    results = await asyncio.gather(
        coalescer.submit([1, 2, 3]), coalescer.submit([4, 5]), coalescer.submit([6])
    )
    assert results == [[10, 20, 30], [40, 50], [60]]
    assert all(len(batch) <= 4 for batch in call.batches), call.batches
    assert [1, 2, 3] in call.batches and sorted(item for b in call.batches for item in b) == [
        1, 2, 3, 4, 5, 6
    ]  # fmt: skip


async def test_a_failed_batch_fails_every_caller_and_the_next_batch_runs() -> None:
    call = Recorder()
    call.fail_with = RuntimeError("valkey away")
    coalescer = Coalescer(call, max_items=10)
    outcomes = await asyncio.gather(
        *(coalescer.submit([n]) for n in range(3)), return_exceptions=True
    )
    assert all(isinstance(o, RuntimeError) and str(o) == "valkey away" for o in outcomes)
    call.fail_with = None
    assert await coalescer.submit([7]) == [70]


async def test_a_cancelled_leader_leaves_the_others_items_to_the_next_leader() -> None:
    call = Recorder()
    call.gate.clear()
    coalescer = Coalescer(call, max_items=10)
    leader = asyncio.create_task(coalescer.submit([1]))
    followers = [asyncio.create_task(coalescer.submit([n])) for n in (2, 3)]
    await call.called.wait()
    assert call.batches == [[1, 2, 3]]
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    call.gate.set()
    assert [await task for task in followers] == [[20], [30]]
    assert call.batches[-1] == [2, 3]


async def test_a_caller_cancelled_while_waiting_is_left_out() -> None:
    call = Recorder()
    call.gate.clear()
    coalescer = Coalescer(call, max_items=10)
    first = asyncio.create_task(coalescer.submit([1]))
    await call.called.wait()
    gone = asyncio.create_task(coalescer.submit([2]))
    kept = asyncio.create_task(coalescer.submit([3]))
    await asyncio.sleep(0)
    gone.cancel()
    call.gate.set()
    assert await first == [10] and await kept == [30]
    assert gone.cancelled()
    assert call.batches == [[1], [3]]


async def test_a_handed_over_leader_cancelled_at_once_passes_the_lead_on() -> None:
    call = Recorder()
    call.gate.clear()
    coalescer = Coalescer(call, max_items=1_000)
    first = asyncio.create_task(coalescer.submit([1]))
    await call.called.wait()
    next_leader = asyncio.create_task(coalescer.submit([2]))
    last = asyncio.create_task(coalescer.submit([3]))
    await asyncio.sleep(0)
    call.gate.set()
    await first  # the lead is handed to the caller of [2] ...
    next_leader.cancel()  # ... which is cancelled before it runs
    assert await asyncio.wait_for(last, 5) == [30]
    assert await coalescer.submit([4]) == [40]  # not stuck


async def test_max_items_one_calls_once_per_submit() -> None:
    call = Recorder()
    coalescer = Coalescer(call, max_items=1)
    assert await asyncio.gather(*(coalescer.submit([n]) for n in range(3))) == [[0], [10], [20]]
    assert call.batches == [[0], [1], [2]]
    with pytest.raises(ValueError, match="at least 1"):
        Coalescer(call, max_items=0)
