"""How a served document's tasks are dealt: evenly across the executors, whatever the
partitions per executor."""

from __future__ import annotations

from collections import Counter

from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from ragflow_mq.spread import dealt_partition, layout_of


def _member(member_id: str, **topics: list[int]) -> dict[str, object]:
    assignment = ConsumerProtocolMemberAssignment(0, list(topics.items()), b"").encode()
    return {"member_id": member_id, "member_assignment": assignment}


def test_thirty_tasks_on_eight_partitions_give_three_executors_ten_each() -> None:
    """Round robin gives one executor 3 partitions of 8: dealt by partition it would get 12
    of 30 tasks (a third round); dealt by member each gets 10, as on Redis."""
    layout = layout_of(
        [
            {
                "members": [
                    _member("c", t=[2, 5]),
                    _member("a", t=[0, 3, 6]),
                    _member("b", t=[1, 4, 7]),
                ]
            }
        ]
    )
    owner = {
        p: m for m, parts in zip("abc", ([0, 3, 6], [1, 4, 7], [2, 5]), strict=True) for p in parts
    }
    for document in ("doc-1", "doc-2", "x" * 40):
        dealt = [dealt_partition(document, turn, "t", range(8), layout) for turn in range(30)]
        assert Counter(owner[p] for p in dealt) == {"a": 10, "b": 10, "c": 10}
        # Each member's partitions in turn too: none takes more than its part of the share.
        counts = Counter(dealt)
        for parts in ([0, 3, 6], [1, 4, 7], [2, 5]):
            assert max(counts[p] for p in parts) - min(counts[p] for p in parts) <= 1


def test_without_a_known_member_the_tasks_go_round_the_partitions() -> None:
    dealt = [dealt_partition("doc", turn, "t", [0, 1, 2, 3], {}) for turn in range(8)]
    assert Counter(dealt) == {0: 2, 1: 2, 2: 2, 3: 2}
    # A member's partition the topic no longer has is not dealt to.
    layout = layout_of([{"members": [_member("a", t=[0, 9])]}])
    assert {dealt_partition("doc", turn, "t", [0, 1], layout) for turn in range(4)} == {0}


def test_a_joining_member_without_an_assignment_is_left_out() -> None:
    layout = layout_of(
        [{"members": [_member("a", t=[0]), {"member_id": "b", "member_assignment": b""}]}]
    )
    assert layout == {"t": ((0,),)}
