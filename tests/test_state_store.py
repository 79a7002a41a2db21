"""The state store (SIDECAR_STATE_URL) against real servers: a whole sidecar keeps its keys
there and reads RAGFlow's in RAGFlow's Valkey; a store that evicts is warned about by
``status`` and at the sidecar's start; a full one (noeviction) refuses writes retriably."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import valkey.asyncio as avalkey
from valkey.exceptions import OutOfMemoryError

from sidecar.app.state_store import eviction_warnings, shares_ragflows_valkey
from sidecar.cli.status import collect_status, render_status
from sidecar.config import Settings
from sidecar.dev.local_stack import LocalValkey
from sidecar.errors import ServerFullError
from sidecar.transport.message import encode_task
from sidecar.transport.topics import init_topics
from sidecar.transport.valkey_client import translate_valkey_errors
from sidecar.transport.valkey_memory import ValkeyMemory, human_bytes
from sidecar.verdicts.join import ALIVE_PREFIX, JOIN_PREFIX, OPEN_KEY, SEEN_PREFIX
from sidecar.verdicts.model import VERDICT_COUNTS_KEY
from tests.conftest import free_port
from tests.faults.support import SidecarProcess, ready, sidecar_env, wait_until
from tests.mirror_support import RAGFLOW_GROUP, ragflow_tasks, ragflow_worker
from tests.shadow_support import read_verdicts, running_sidecar, sidecar_settings

MiB = 1024 * 1024


def state_url(server: LocalValkey, db: int = 0) -> str:
    return f"redis://127.0.0.1:{server.port}/{db}"


def state_client(server: LocalValkey, db: int = 0) -> avalkey.Valkey:
    return avalkey.Valkey(host="127.0.0.1", port=server.port, db=db, decode_responses=False)


async def keys(client: avalkey.Valkey, pattern: str) -> list[bytes]:
    return [key async for key in client.scan_iter(match=pattern, count=1000)]


@pytest.mark.parametrize(
    ("policy", "maxmemory", "shared", "lines"),
    [
        ("noeviction", 128 * MiB, True, 0),  # refuses writes instead: ridden out
        ("allkeys-lru", 0, True, 0),  # no limit, nothing evicted
        ("allkeys-lru", 128 * MiB, False, 1),  # RAGFlow's compose: allkeys-lru at 128 MB
        ("allkeys-lru", 128 * MiB, True, 2),  # ... and it is RAGFlow's own Valkey
        ("volatile-ttl", 64 * MiB, False, 1),  # every per-task key has a TTL
        ("allkeys-random", 64 * MiB, True, 2),
    ],
)
def test_a_store_that_can_evict_our_keys_is_warned_about(
    policy: str, maxmemory: int, shared: bool, lines: int
) -> None:
    environ = {"REDIS_URL": "redis://:pw@redis:6379/1"}
    if not shared:
        environ["SIDECAR_STATE_URL"] = "redis://:state-pw@sidecar-state:6379/0"
    settings = Settings.from_env(environ)
    assert shares_ragflows_valkey(settings) is shared
    memory = ValkeyMemory(used_memory=MiB, maxmemory=maxmemory, policy=policy, evicted_keys=3)
    warnings = eviction_warnings(settings, memory)
    assert len(warnings) == lines
    if warnings:
        assert f"maxmemory-policy {policy}" in warnings[0] and "noeviction" in warnings[0]
        assert "pw" not in " ".join(warnings).replace("***", "")
    if lines == 2:
        assert "RAGFlow's own Valkey" in warnings[1] and "SIDECAR_STATE_URL" in warnings[1]
    # Another db of RAGFlow's server shares its maxmemory: still RAGFlow's Valkey.
    other_db = Settings.from_env({**environ, "SIDECAR_STATE_URL": "redis://redis:6379/5"})
    assert shares_ragflows_valkey(other_db)


def test_sizes_read_as_info_writes_them() -> None:
    assert [human_bytes(n) for n in (512, 1536, 128 * MiB, 3 * 1024 * MiB)] == [
        "512 B",
        "1.5 KiB",
        "128.0 MiB",
        "3.0 GiB",
    ]


async def test_a_full_store_refuses_writes_with_a_retriable_error(
    state_valkey: LocalValkey,
) -> None:
    """noeviction at maxmemory: a plain write, a script and a script in a pipeline are refused
    with ServerFullError (retriable), whose text holds no argument of the command."""
    client = state_client(state_valkey)
    where = state_url(state_valkey)
    try:
        used = int((await client.info("memory"))["used_memory"])
        await client.config_set("maxmemory", used + 64 * 1024)
        await fill_until_full(client)
        script = client.register_script("redis.call('HSET', KEYS[1], 'f', ARGV[1]) return 1")
        with (
            pytest.raises(ServerFullError) as plain,
            translate_valkey_errors("take the dedup key", where),
        ):
            await client.set("ragflow_sidecar:seen:x", b"me", nx=True, ex=60)
        with (
            pytest.raises(ServerFullError) as scripted,
            translate_valkey_errors("record the kafka run", where),
        ):
            await script(keys=["ragflow_sidecar:join:x"], args=[b"secret-task-bytes"])
        with (
            pytest.raises(ServerFullError) as piped,
            translate_valkey_errors("record the redis run", where),
        ):
            pipe = client.pipeline(transaction=False)
            for n in range(2):
                await script(keys=[f"k{n}"], args=[b"secret-task-bytes"], client=pipe)
            await pipe.execute()
        for caught in (plain, scripted, piped):
            assert caught.value.retriable and not caught.value.needs_new_client
            assert "maxmemory" in str(caught.value) and where in str(caught.value)
            assert "secret-task-bytes" not in str(caught.value)
        assert await client.get("ragflow_sidecar:seen:x") is None  # nothing half-written
        assert await client.ping()  # reads and pings still answer
    finally:
        await client.aclose()


async def fill_until_full(client: avalkey.Valkey, value_bytes: int = 4096) -> int:
    """SET filler keys (no TTL) until Valkey refuses one at its maxmemory; returns how many."""
    count = 0
    while True:
        try:
            await client.set(f"filler:{count}", b"x" * value_bytes)
        except OutOfMemoryError:
            return count
        count += 1
        assert count < 1_000_000, "never refused: no maxmemory?"


async def test_a_sidecar_keeps_its_state_in_the_state_store_only(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    state_valkey: LocalValkey,
) -> None:
    """Every key of the join, dedup, liveness and the counts is in the state store, none in
    RAGFlow's Valkey; RAGFlow's cancel keys are read where RAGFlow writes them; all match."""
    await init_topics(settings.kafka)
    stream = f"{unique}.0"
    tasks = ragflow_tasks(20)
    # RAGFlow's cancel flag, in RAGFlow's Valkey: both runs must see this task cancelled.
    cancelled_task = str(tasks[4]["id"])
    await valkey_client.set(f"{cancelled_task}-cancel", b"x")
    ids = [
        (await valkey_client.xadd(stream, {"message": encode_task(task)})).decode()
        for task in tasks
    ]
    await valkey_client.xgroup_create(stream, RAGFLOW_GROUP, id="0")
    ragflow_counts = await valkey_client.hgetall(VERDICT_COUNTS_KEY)
    config = sidecar_settings(settings, [stream], unique, SIDECAR_STATE_URL=state_url(state_valkey))
    assert config.redis == settings.redis and config.state.port == state_valkey.port
    state = state_client(state_valkey)
    try:
        async with running_sidecar(config):
            await ragflow_worker(valkey_client, stream, len(tasks))
            verdicts = await read_verdicts(settings, {stream}, expected=len(tasks))
            alive = f"{ALIVE_PREFIX}sidecar-{unique}"
            assert await state.exists(alive) and not await valkey_client.exists(alive)
        finals = [v for v in verdicts if v["verdict"] != "duplicate"]
        assert sorted(v["entry_id"] for v in finals) == sorted(ids)
        assert {v["verdict"] for v in finals} == {"match"}

        for pattern in (f"{JOIN_PREFIX}{stream}:*", f"{SEEN_PREFIX}{stream}:*"):
            assert len(await keys(state, pattern)) == len(tasks), pattern
            assert await keys(valkey_client, pattern) == [], pattern
        assert int((await state.hgetall(VERDICT_COUNTS_KEY))[b"match"]) == len(tasks)
        assert await valkey_client.hgetall(VERDICT_COUNTS_KEY) == ragflow_counts
        for client in (state, valkey_client):  # decided: out of the open index everywhere
            members = await client.zrange(OPEN_KEY, 0, -1)
            assert not [m for m in members if m.startswith(stream.encode())]

        for task, entry_id in zip(tasks, ids, strict=True):
            joined = await state.hgetall(f"{JOIN_PREFIX}{stream}:{entry_id}")
            for side in (b"redis_run", b"kafka_run"):
                decision = json.loads(joined[side])["outcome"]["decision"]
                assert (decision == "cancelled") is (str(task["id"]) == cancelled_task), side

        # status reads the counts and the memory of the state store, and warns of nothing.
        report = await collect_status(config)
        assert report.verdict_counts["match"] == len(tasks)
        assert report.state == config.state.display_url and not report.state_is_ragflows
        assert report.state_memory is not None and report.state_memory.policy == "noeviction"
        assert report.state_memory.used_memory > 0 and not report.state_warnings
        output = render_status(report)
        assert f"state store   {config.state.display_url} (a Valkey of its own)" in output
        assert "maxmemory no limit, maxmemory-policy noeviction, evicted_keys 0" in output
        assert "WARNING" not in output
    finally:
        await state.aclose()


async def test_an_evicting_store_at_its_limit_is_warned_about_by_status_and_at_start(
    settings: Settings, unique: str, state_valkey: LocalValkey, tmp_path: Path
) -> None:
    state = state_client(state_valkey)
    try:
        await state.config_set("maxmemory-policy", "allkeys-lru")
        used = int((await state.info("memory"))["used_memory"])
        limit = used + MiB
        await state.config_set("maxmemory", limit)
        for start in range(0, 2048, 256):  # 2 MiB of keys into 1 MiB of room: evictions
            pipe = state.pipeline(transaction=False)
            for n in range(start, start + 256):
                pipe.set(f"filler:{n}", b"x" * 4096)
            await pipe.execute()
        assert int((await state.info("stats"))["evicted_keys"]) > 0

        bootstrap = ",".join(settings.kafka.bootstrap_servers)
        apart = Settings.from_env(
            {
                "REDIS_URL": settings.redis.display_url,
                "SIDECAR_STATE_URL": state_url(state_valkey),
                "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            }
        )
        report = await collect_status(apart)
        memory = report.state_memory
        assert memory is not None
        assert (memory.maxmemory, memory.policy) == (limit, "allkeys-lru")
        assert memory.evicted_keys > 0 and used < memory.used_memory <= limit + 64 * 1024
        assert len(report.state_warnings) == 1
        output = render_status(report)
        assert f"WARNING: the state store {apart.state.display_url} evicts keys" in output
        percent = 100 * memory.used_memory / limit
        assert (
            f"state memory  used_memory {human_bytes(memory.used_memory)} ({percent:.0f}%), "
            f"maxmemory {human_bytes(limit)}, maxmemory-policy allkeys-lru, "
            f"evicted_keys {memory.evicted_keys}"
        ) in output

        # The same server as REDIS_URL (SIDECAR_STATE_URL unset): RAGFlow's own Valkey.
        shared = Settings.from_env(
            {"REDIS_URL": state_url(state_valkey, db=1), "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
        )
        shared_report = await collect_status(shared)
        assert len(shared_report.state_warnings) == 2
        assert "(RAGFlow's Valkey)" in render_status(shared_report)
        assert "WARNING: the state store" in render_status(shared_report).splitlines()[-1]
        assert "is RAGFlow's own Valkey" in shared_report.state_warnings[1]

        # The sidecar says it once when it starts, and runs all the same.
        port = free_port()
        env = sidecar_env(
            settings.redis.display_url,
            bootstrap,
            f"{unique}.0",
            unique,
            SIDECAR_STATE_URL=state_url(state_valkey),
            SIDECAR_METRICS_PORT=str(port),
        )
        log = tmp_path / "sidecar.log"
        with SidecarProcess(["run"], env, log) as sidecar:
            await wait_until(lambda: ready(port), "the sidecar to be ready", timeout_s=120)
            assert sidecar.stop() == 0
        text = log.read_text()
        assert text.count("evicts keys at its limit") == 1, text[-3000:]
        assert "maxmemory-policy allkeys-lru" in text and "WARNING sidecar.app.state_store" in text
    finally:
        await state.aclose()
