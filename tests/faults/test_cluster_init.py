"""The three-broker cluster itself: ``local-stack up --brokers 3`` and ``down`` by the project's
own scripts, and ``init-topics`` on it (three replicas, ``min.insync.replicas`` 2; a factor
above the live brokers refused, naming both)."""

from __future__ import annotations

import asyncio
import re
import socket
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from sidecar.config import Settings
from sidecar.dev.local_stack import LocalStack
from sidecar.dev.local_stack.broker_faults import BrokerFaults
from sidecar.errors import MessageQueueError
from sidecar.transport.topics import TOPIC_PLAN, init_topics
from tests.conftest import free_port
from tests.faults.support import wait_until
from tests.test_cli import run_cli

pytestmark = [pytest.mark.faults, pytest.mark.cluster, pytest.mark.timeout(300)]


async def test_init_topics_makes_three_replicas_with_two_in_sync_required(
    cluster_settings: Settings, brokers: BrokerFaults
) -> None:
    states = await brokers.partitions(list(TOPIC_PLAN))
    assert len(states) == sum(TOPIC_PLAN.values())
    assert {len(state.replicas) for state in states.values()} == {3}
    min_isr: dict[str, str] = {}

    async def configured() -> bool:
        # Asked of any broker: one whose metadata trails the topics' creation has no configs.
        nonlocal min_isr
        admin = AIOKafkaAdminClient(**cluster_settings.kafka.client_kwargs())
        await admin.start()
        try:
            described = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, name) for name in TOPIC_PLAN]
            )
        finally:
            await admin.close()
        min_isr = {
            resource[3]: value
            for response in described
            for resource in response.resources
            for name, value, *_ in resource[4]
            if name == "min.insync.replicas"
        }
        return len(min_isr) == len(TOPIC_PLAN)

    await wait_until(configured, "every topic's configs", 30, 0.5)
    assert min_isr == dict.fromkeys(TOPIC_PLAN, "2")


async def test_a_replication_factor_above_the_live_brokers_is_refused(
    cluster_settings: Settings, brokers: BrokerFaults
) -> None:
    result = await asyncio.to_thread(
        run_cli,
        "init-topics",
        "--replication-factor",
        "4",
        env={"KAFKA_BOOTSTRAP_SERVERS": brokers.cluster.bootstrap_servers},
    )
    assert result.returncode == 2, result
    assert "replication factor 4 is more than the 3 live brokers" in result.stderr
    # A broker stopped in order leaves the cluster's metadata at once: 3 is now too many.
    await asyncio.to_thread(brokers.stop, 3)
    name = f"test.rf.{uuid.uuid4().hex[:8]}"
    with pytest.raises(MessageQueueError, match="replication factor 3 is more than the 2 live"):
        await init_topics(cluster_settings.kafka, plan={name: 1}, replication_factor=3)
    admin = AIOKafkaAdminClient(**cluster_settings.kafka.client_kwargs())
    await admin.start()
    try:
        [described] = await admin.describe_topics([name])
    finally:
        await admin.close()
    assert described["error_code"] == 3, "nothing is made"  # UNKNOWN_TOPIC_OR_PARTITION


async def test_an_existing_topic_with_fewer_replicas_is_reported_never_altered(
    cluster_settings: Settings, brokers: BrokerFaults
) -> None:
    name = f"test.rf.{uuid.uuid4().hex[:8]}"
    first = await init_topics(cluster_settings.kafka, plan={name: 2}, replication_factor=1)
    assert first.ok and first.created == [name]
    report = await init_topics(cluster_settings.kafka, plan={name: 2}, replication_factor=3)
    assert not report.ok
    assert report.under_replicated == [(name, 1, 3)]
    assert any(
        line.startswith(f"PROBLEM {name} has 1 replica per partition, 3 were asked for")
        for line in report.lines()
    ), report.lines()
    states = await brokers.partitions([name])
    assert {len(state.replicas) for state in states.values()} == {1}  # reported, never altered


def _free_base() -> int:
    """A port with the two tens above it free too (the cluster's other nodes)."""
    for _ in range(50):
        base = free_port()
        if base + 20 < 65536 and all(_free(base + step) for step in (10, 20)):
            return base
    raise AssertionError("no free port triple")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.servers
def test_local_stack_up_brokers_3_and_down(tmp_path: Path) -> None:
    root = tmp_path / "stack"
    kafka, controller = _free_base(), _free_base()
    ports = [
        "--dir", str(root), "--valkey-port", str(free_port()),
        "--kafka-port", str(kafka), "--kafka-controller-port", str(controller),
    ]  # fmt: skip
    try:
        up = run_cli("local-stack", "up", "--brokers", "3", *ports)
        assert up.returncode == 0, up.stderr[-2000:]
        exported = re.search(r"KAFKA_BOOTSTRAP_SERVERS=(\S+)", up.stdout)
        assert exported is not None, up.stdout
        assert exported.group(1) == ",".join(f"127.0.0.1:{kafka + n}" for n in (0, 10, 20))
        status = run_cli("local-stack", "status", "--dir", str(root))
        assert status.returncode == 0, status.stdout
        for node in ("kafka-1", "kafka-2", "kafka-3"):
            assert re.search(rf"^{node} +running .* answering", status.stdout, re.M), status.stdout
    finally:
        down = run_cli("local-stack", "down", "--dir", str(root))
    assert down.returncode == 0, down.stderr
    assert set(down.stdout.split("stopped ")[1].strip().split(", ")) == {
        "kafka-1", "kafka-2", "kafka-3", "valkey",
    }  # fmt: skip
    assert not LocalStack.from_state(root).cluster.running()  # type: ignore[union-attr]


# Refused before anything starts, but `local-stack up` is a server's command to the guard
# (tests/tiers.py), which cannot tell a refusal in advance.
@pytest.mark.servers
def test_the_cluster_refuses_what_it_cannot_be(tmp_path: Path) -> None:
    secured = run_cli("local-stack", "up", "--brokers", "3", "--secured", "--dir", str(tmp_path))
    assert secured.returncode == 2
    assert "--secured runs on the single broker, not --brokers 3" in secured.stderr
    two = run_cli("local-stack", "up", "--brokers", "2", "--dir", str(tmp_path))
    assert two.returncode == 2
    assert "invalid choice: 2 (choose from 1, 3)" in two.stderr
    assert not any(tmp_path.iterdir()), "nothing was started or written"
