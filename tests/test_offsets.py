"""Contiguous completion: the committable offset never passes an unfinished one."""

from __future__ import annotations

from sidecar.transport.offsets import PartitionOffsets
from sidecar.transport.redelivery import DelayedRedeliveries


def test_out_of_order_completion_commits_only_the_contiguous_prefix() -> None:
    offsets = PartitionOffsets()
    assert offsets.committable() is None
    for offset in range(6):
        offsets.delivered(offset)
    assert offsets.committable() == 0
    offsets.finished(5)
    assert offsets.committable() == 0
    for offset in (0, 1, 2):
        offsets.finished(offset)
    assert offsets.committable() == 3
    assert offsets.in_flight == 2
    offsets.finished(4)
    assert offsets.committable() == 3
    offsets.finished(3)
    assert offsets.committable() == 6
    assert offsets.in_flight == 0


def test_gaps_in_offsets_do_not_stall_commits() -> None:
    # Compacted topics and transaction markers leave holes in the offsets delivered.
    offsets = PartitionOffsets()
    for offset in (10, 13, 20):
        offsets.delivered(offset)
    offsets.finished(13)
    assert offsets.committable() == 10
    offsets.finished(10)
    assert offsets.committable() == 20
    offsets.finished(20)
    assert offsets.committable() == 21


def test_redeliveries_come_due_in_time_order() -> None:
    now = [100.0]
    queue: DelayedRedeliveries[str] = DelayedRedeliveries(clock=lambda: now[0])
    queue.push("late", 2000)
    queue.push("soon", 500)
    assert queue.pop_due(10) == []
    assert queue.seconds_until_next() == 0.5
    now[0] += 0.5
    assert queue.pop_due(10) == ["soon"]
    now[0] += 2
    queue.push("now", 0)
    queue.discard(lambda item: item == "now")
    assert queue.pop_due(10) == ["late"]
    assert queue.seconds_until_next() is None
