"""The mirror's key partitioner places every key where Kafka's default partitioner does."""

from __future__ import annotations

import random

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2

from sidecar.transport.partitioner import KeyPartitioner, murmur2


def test_murmur2_matches_aiokafka_for_every_length_and_random_bytes() -> None:
    rng = random.Random(7)
    keys = [rng.randbytes(length) for length in range(300) for _ in range(20)]
    keys += [b"", b"a", "文档".encode(), b"graph_raptor_x", b"\xff" * 1000]
    mismatched = [key for key in keys if murmur2(key) != aiokafka_murmur2(key)]
    assert mismatched == []


def test_known_values_of_kafkas_murmur2() -> None:
    # From Apache Kafka's UtilsTest.testMurmur2 (signed ints there, unsigned here).
    expected = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536}
    assert {key: murmur2(key) for key in expected} == {
        key: value & 0xFFFFFFFF for key, value in expected.items()
    }


def test_placement_equals_the_default_partitioner() -> None:
    ours, theirs = KeyPartitioner(), DefaultPartitioner()
    partitions = list(range(8))
    for n in range(5000):
        key = f"doc-{n:05d}".encode()
        assert ours(key, partitions, partitions) == theirs(key, partitions, partitions)


def test_unkeyed_records_go_to_an_available_partition() -> None:
    chosen = {KeyPartitioner()(None, [0, 1, 2, 3], [2]) for _ in range(50)}
    assert chosen == {2}
