"""Secured connections against real servers: Kafka over SASL_SSL with SCRAM-SHA-512 (a broker of
this module's own, with a throwaway CA), Valkey with the ACL user of docs/security.md, and no
secret in anything the commands print or the spans they export."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import valkey.asyncio as avalkey

from sidecar.app.wiring import running_judge
from sidecar.config import Settings
from sidecar.dev.local_stack import LocalKafka
from sidecar.dev.local_stack.tls import make_tls_files
from sidecar.errors import AuthenticationError
from sidecar.transport.lag import stream_lag
from sidecar.transport.message import encode_task
from sidecar.transport.topics import init_topics
from sidecar.verdicts.join import Arrival, EntryRef
from tests import tiers
from tests.conftest import free_port, kafka_version
from tests.mirror_support import RAGFLOW_GROUP, ragflow_tasks, ragflow_worker, read_mirrored
from tests.otlp_support import Collector
from tests.shadow_support import read_verdicts, running_sidecar, sidecar_settings

DOC = Path(__file__).parent.parent / "docs" / "security.md"
COMMAND_TIMEOUT_S = 90


@pytest.fixture(scope="module")
@tiers.starts_servers
def secured_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A broker with a SASL_SSL listener; the session's broker is not restarted for it."""
    root = tmp_path_factory.mktemp("secured-kafka")
    broker = LocalKafka(root, free_port(), free_port(), kafka_version(), sasl_ssl_port=free_port())
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()


def secured_settings(base: Settings, broker: LocalKafka, **extra: str) -> Settings:
    return Settings.from_env(
        {
            "REDIS_URL": f"redis://{base.redis.host}:{base.redis.port}/1",
            **broker.secured_client_env(),
            "KAFKA_LINGER_MS": "1",
            **extra,
        }
    )


def command_env(**variables: str) -> dict[str, str]:
    """The test's environment without any sidecar setting, plus ``variables``."""
    prefixes = ("KAFKA_", "MIRROR_", "REDIS_", "SHADOW_", "OTEL_", "SIDECAR_")
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(prefixes)},
        "SIDECAR_METRICS_PORT": "0",
        **variables,
    }


def mirror_env(
    redis_url: str, kafka: dict[str, str], stream: str, group: str, **extra: str
) -> dict[str, str]:
    """``command_env`` for a mirror of ``stream`` from its start in ``group``; ``kafka`` holds the
    Kafka connection's variables."""
    return command_env(
        REDIS_URL=redis_url,
        **kafka,
        MIRROR_STREAMS=stream,
        MIRROR_START="earliest",
        MIRROR_GROUP=group,
        **extra,
    )


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def run_command(args: list[str], env: dict[str, str]) -> Ran:
    """``ragflow-sidecar ARGS`` to completion, output captured."""
    done = subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    return Ran(done.returncode, done.stdout, done.stderr)


def start_command(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sidecar", *args], env=env, stdout=out, stderr=out
        )


def stop_command(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM and wait; SIGKILL if it does not stop (by pid, our own child only)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def mirrored_all(
    client: avalkey.Valkey,
    stream: str,
    group: str,
    process: subprocess.Popen[bytes],
    log: Path,
    timeout_s: float = 60,
) -> None:
    """Wait until the mirror's group has read and acked every entry of ``stream``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the command exited early:\n{tail(log)}"
        if (
            await stream_lag(client, stream, group) == 0
            and (await client.xpending(stream, group))["pending"] == 0
        ):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{stream} not mirrored in {timeout_s} s:\n{tail(log)}")


def tail(log: Path) -> str:
    return tail(log)


async def enqueue(client: avalkey.Valkey, stream: str, total: int) -> list[dict[str, Any]]:
    tasks = ragflow_tasks(total)
    for task in tasks:
        await client.xadd(stream, {"message": encode_task(task)})
    return tasks


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


# --- Kafka over SASL_SSL ------------------------------------------------------------------------


@pytest.mark.kafka39
async def test_init_topics_and_the_mirror_over_sasl_ssl_with_scram(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    secured_broker: LocalKafka,
    tmp_path: Path,
) -> None:
    secured = secured_settings(settings, secured_broker)
    assert secured.kafka.security_protocol == "SASL_SSL"
    env = mirror_env(
        f"redis://{settings.redis.host}:{settings.redis.port}/1",
        secured_broker.secured_client_env(),
        unique,
        f"mirror-{unique}",
        MIRROR_BLOCK_MS="100",
    )
    topics = run_command(["init-topics"], env)
    assert topics.returncode == 0, topics.stderr
    assert "ragflow.task.parse" in topics.stdout
    tasks = await enqueue(valkey_client, unique, 12)
    log = tmp_path / "mirror.log"
    mirror = start_command(["mirror"], env, log)
    try:
        await mirrored_all(valkey_client, unique, f"mirror-{unique}", mirror, log)
    finally:
        assert stop_command(mirror) == 0, tail(log)
    found = await read_mirrored(secured, {unique}, len(tasks))
    assert sorted(json.loads(m.value or b"")["id"] for m in found) == sorted(t["id"] for t in tasks)
    assert " ERROR " not in log.read_text()


@pytest.mark.kafka39
@pytest.mark.parametrize("fault", ["wrong password", "wrong CA"])
async def test_a_refused_login_is_one_clear_line_and_nothing_is_acked(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    secured_broker: LocalKafka,
    tmp_path: Path,
    fault: str,
) -> None:
    await init_topics(secured_settings(settings, secured_broker).kafka)
    group = f"mirror-{unique}"
    kafka = secured_broker.secured_client_env()
    if fault == "wrong password":
        kafka["KAFKA_SASL_PASSWORD"] = f"not-{kafka['KAFKA_SASL_PASSWORD']}"
        expected = re.compile(
            r"^ragflow-sidecar: error: Kafka at 127\.0\.0\.1:\d+ refused to let us log in as "
            r"'ragflow-sidecar' with SCRAM-SHA-512: .*SaslAuthenticationFailed"
        )
    else:
        kafka["KAFKA_SSL_CAFILE"] = str(make_tls_files(tmp_path / "other-ca").ca_file)
        expected = re.compile(
            r"^ragflow-sidecar: error: Kafka at 127\.0\.0\.1:\d+: TLS handshake failed "
            r"\(CERTIFICATE_VERIFY_FAILED\); is KAFKA_SSL_CAFILE"
        )
    env = mirror_env(f"redis://{settings.redis.host}:{settings.redis.port}/1", kafka, unique, group)
    await enqueue(valkey_client, unique, 5)
    for command in (["mirror"], ["run"], ["init-topics"]):
        ran = run_command(command, env)
        assert ran.returncode == 2, (command, ran.stderr)
        lines = error_lines(ran.stderr)
        assert len(lines) == 1 and expected.match(lines[0]), (command, ran.stderr)
    # The mirror stopped before reading: its group was never made, nothing is acked or pending.
    groups = [g["name"].decode() for g in await valkey_client.xinfo_groups(unique)]
    assert group not in groups
    assert await valkey_client.xlen(unique) == 5


# --- Valkey with the documented ACL user --------------------------------------------------------


def documented_acl(user: str, password: str, drop: str | None = None) -> list[str]:
    """The ACL SETUSER line of docs/security.md for ``user``, less the rule ``drop``."""
    lines = [line for line in DOC.read_text().splitlines() if line.startswith("ACL SETUSER ")]
    assert len(lines) == 1, "docs/security.md must hold exactly one ACL SETUSER line"
    words = shlex.split(lines[0])
    assert words[2] == "ragflow-sidecar" and ">CHANGE-ME" in words
    words[2] = user
    words[words.index(">CHANGE-ME")] = f">{password}"
    if drop is not None:
        words.remove(drop)
    return words


@dataclass
class AclUser:
    """A user name and password of one test's own; ``make`` creates the user."""

    client: avalkey.Valkey
    name: str
    password: str
    made: bool = False

    async def make(
        self, *, password: str | None = None, drop: str | None = None
    ) -> tuple[str, str]:
        """Create the user with docs/security.md's ACL (less the rule ``drop``), with
        ``password`` if given; returns its name and password."""
        self.password = password or self.password
        await self.client.execute_command(*documented_acl(self.name, self.password, drop))
        self.made = True
        return self.name, self.password


@pytest.fixture
async def acl_user(valkey_client: avalkey.Valkey, unique: str) -> AsyncIterator[AclUser]:
    """A user name and password; the test makes the user, it is deleted afterwards."""
    user = AclUser(valkey_client, f"sidecar-{unique}", f"pw-{uuid.uuid4().hex}")
    yield user
    if user.made:
        await valkey_client.execute_command("ACL", "DELUSER", user.name)


async def denials(client: avalkey.Valkey, user: str) -> set[str]:
    """What ``user`` was refused, from ACL LOG (CLIENT SETINFO is refused on purpose)."""
    entries = await client.execute_command("ACL", "LOG", "128")
    refused = set()
    for entry in entries:
        fields = dict(zip(entry[::2], entry[1::2], strict=True))
        if fields[b"username"].decode() == user:
            refused.add(f"{fields[b'reason'].decode()}:{fields[b'object'].decode()}")
    return refused - {"command:client|setinfo"}


async def test_the_documented_acl_runs_the_whole_sidecar(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    acl_user: AclUser,
) -> None:
    await init_topics(settings.kafka)
    user, password = await acl_user.make()
    url = f"redis://{user}:{password}@{settings.redis.host}:{settings.redis.port}/1"
    high, low = f"te.{unique}.1", f"te.{unique}.0"
    for stream, count in ((high, 3), (low, 12)):
        await enqueue(valkey_client, stream, count)
        await valkey_client.xgroup_create(stream, RAGFLOW_GROUP, id="0")
    config = sidecar_settings(settings, [high, low], unique, REDIS_URL=url)
    assert config.redis.username == user
    async with running_sidecar(config):
        handled = await asyncio.gather(
            ragflow_worker(valkey_client, high, 3), ragflow_worker(valkey_client, low, 12)
        )
        verdicts = await read_verdicts(settings, {high, low}, expected=15)
    assert [len(h) for h in handled] == [3, 12]
    finals = {(v["stream"], v["entry_id"]): v["verdict"] for v in verdicts}
    assert len(finals) == 15 and set(finals.values()) == {"match"}, verdicts
    # The one-shot commands with the same user.
    env = command_env(
        REDIS_URL=url,
        KAFKA_BOOTSTRAP_SERVERS=",".join(settings.kafka.bootstrap_servers),
        MIRROR_STREAMS=f"{high},{low}",
        MIRROR_GROUP=f"mirror-{unique}",
        SHADOW_GROUP=f"shadow-{unique}",
    )
    for command in (["status"], ["check"]):
        ran = run_command(command, env)
        assert ran.returncode == 0, (command, ran.stdout, ran.stderr)
    assert await denials(valkey_client, user) == set()


async def test_a_user_lacking_a_needed_command_is_told_which(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    acl_user: AclUser,
) -> None:
    """The command fails at once with exit code 2 and a line naming the command refused."""
    await init_topics(settings.kafka)
    user, password = await acl_user.make(drop="+xautoclaim")
    stream = f"te.{unique}.0"
    await enqueue(valkey_client, stream, 3)
    env = mirror_env(
        f"redis://{user}:{password}@{settings.redis.host}:{settings.redis.port}/1",
        {"KAFKA_BOOTSTRAP_SERVERS": ",".join(settings.kafka.bootstrap_servers)},
        stream,
        f"mirror-{unique}",
    )
    ran = run_command(["mirror"], env)
    assert ran.returncode == 2, ran.stderr
    last = error_lines(ran.stderr)[-1]
    assert last == (
        f"ragflow-sidecar: error: Valkey at redis://{user}:***@{settings.redis.host}:"
        f"{settings.redis.port}/1: the user may not XAUTOCLAIM {stream} (User {user} has no "
        "permissions to run the 'xautoclaim' command); see docs/security.md"
    ), ran.stderr
    assert password not in ran.stderr


async def test_a_command_refused_inside_the_join_script_is_named_too(
    settings: Settings, unique: str, acl_user: AclUser
) -> None:
    """A script runs with its caller's ACL; the refusal names the command, not the arguments."""
    user, password = await acl_user.make(drop="+hincrby")
    config = sidecar_settings(
        settings,
        [f"te.{unique}.0"],
        unique,
        REDIS_URL=f"redis://{user}:{password}@{settings.redis.host}:{settings.redis.port}/1",
    )
    facts = json.dumps({"task_id": f"task-{unique}", "detail": "x" * 500}).encode()
    arrivals = [
        Arrival(EntryRef(f"te.{unique}.0", f"{n}-0"), facts, b"{}", origin=f"t:0:{n}")
        for n in (1, 2)  # two: one script call for the batch, refused inside the script
    ]
    async with running_judge(config) as judge:
        with pytest.raises(AuthenticationError) as refused:
            await judge.record("kafka_run", arrivals)
    message = str(refused.value)
    assert "the user may not record the kafka run (ACL failure in script: " in message
    assert f"User {user} has no permissions to run the 'hincrby' command" in message
    assert message.endswith("; see docs/security.md") and len(message) < 400, message
    assert unique not in message.replace(user, "")  # no key, fact or value of the call


# --- no secret in output or spans ---------------------------------------------------------------


async def test_no_secret_in_any_output_or_span(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    secured_broker: LocalKafka,
    acl_user: AclUser,
    collector: Collector,
    tmp_path: Path,
) -> None:
    await init_topics(secured_settings(settings, secured_broker).kafka)
    # Distinctive secrets, with characters that URL encoding and logging might change.
    redis_secret = f"Valkey-S3cret/{uuid.uuid4().hex}@x"
    otlp_secret = f"Otlp-S3cret-{uuid.uuid4().hex}"
    wrong_kafka_secret = f"Wrong-Kafka-S3cret-{uuid.uuid4().hex}"
    user, _ = await acl_user.make(password=redis_secret)
    kafka = secured_broker.secured_client_env()
    secrets = [kafka["KAFKA_SASL_PASSWORD"], redis_secret, otlp_secret, wrong_kafka_secret]
    stream = f"te.{unique}.0"
    host = f"{settings.redis.host}:{settings.redis.port}"
    env = mirror_env(
        f"redis://{user}:{quote(redis_secret, safe='')}@{host}/1",
        kafka,
        stream,
        f"mirror-{unique}",
        MIRROR_BLOCK_MS="100",
        SHADOW_GROUP=f"shadow-{unique}",
        SHADOW_START="latest",
        SHADOW_COMPARE_TIMEOUT_S="1",
        SIDECAR_INSTANCE=f"sidecar-{unique}",
        STATUS_INTERVAL_S="0.5",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=collector.endpoint,
        OTEL_EXPORTER_OTLP_TRACES_HEADERS=f"authorization=Bearer%20{otlp_secret}",
    )
    captured: list[str] = []
    await enqueue(valkey_client, stream, 6)
    for level, command in (("DEBUG", "run"), ("INFO", "mirror")):
        log = tmp_path / f"{command}.log"
        process = start_command(["--log-level", level, command], env, log)
        try:
            await mirrored_all(valkey_client, stream, f"mirror-{unique}", process, log)
        finally:
            # In a thread: the collector on this event loop receives the spans flushed at exit.
            assert await asyncio.to_thread(stop_command, process) == 0, tail(log)
        captured.append(log.read_text())
        await enqueue(valkey_client, stream, 3)  # something new for the next command
    for level in ("DEBUG", "INFO"):
        for command in (["status"], ["check"], ["diffs", "--since", "10m"], ["init-topics"]):
            ran = await asyncio.to_thread(run_command, ["--log-level", level, *command], env)
            assert ran.returncode in (0, 1), (command, ran.stderr)
            captured += [ran.stdout, ran.stderr]
        refused = await asyncio.to_thread(
            run_command,
            ["--log-level", level, "mirror"],
            {**env, "KAFKA_SASL_PASSWORD": wrong_kafka_secret},
        )
        assert refused.returncode == 2 and "refused" in refused.stderr, refused.stderr
        captured += [refused.stdout, refused.stderr]
        bad_valkey = await asyncio.to_thread(
            run_command,
            ["--log-level", level, "check"],
            {**env, "REDIS_URL": f"redis://{user}:{quote(wrong_kafka_secret)}@{host}/1"},
        )
        assert bad_valkey.returncode == 2, bad_valkey.stderr
        captured += [bad_valkey.stdout, bad_valkey.stderr]

    assert len(collector.spans()) > 0, "no span was exported"
    everything = "\n".join(captured)
    # What was captured is what matters: the debug logs, masked URLs, the users' names.
    assert "DEBUG" in everything and f"redis://{user}:***@" in everything
    assert f"as {kafka['KAFKA_SASL_USERNAME']!r} with SCRAM-SHA-512" in everything
    for secret in secrets:
        for form in {secret, quote(secret, safe=""), quote(secret)}:
            assert form not in everything, f"a secret appeared in the output: {form!r}"
            for raw in collector.received:
                assert form.encode() not in raw, f"a secret appeared in a span: {form!r}"
