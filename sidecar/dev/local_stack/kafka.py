"""A real Apache Kafka broker (KRaft, combined broker+controller) from Maven Central's jars.

The jars are fetched once into a cache with ``mvn dependency:copy-dependencies`` over the
``pom.xml`` beside this file and run with the machine's Java (17 or newer) as ``kafka.Kafka``.
The data directory is formatted on first start only, so the broker survives a stop/start and a
``kill -9`` followed by a start on the same data.

With ``sasl_ssl_port``, the broker also listens there with SASL_SSL: TLS with a throwaway
certificate (:mod:`sidecar.dev.local_stack.tls`, made afresh at each start) and SCRAM-SHA-512 for
one user (more with ``principals``), created when the storage is formatted. The PLAINTEXT
listener stays, for the tooling. With ``authorizer``, KRaft's ``StandardAuthorizer`` enforces ACLs
on the SASL_SSL listener; the PLAINTEXT listener's ``User:ANONYMOUS`` (the tooling, and the
broker's own requests to its controller) is the super user.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import fcntl
import os
import re
import secrets
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from sidecar.dev.local_stack.process import ManagedProcess
from sidecar.dev.local_stack.tls import TlsFiles, make_tls_files, tls_files
from sidecar.errors import LocalStackError

DEFAULT_KAFKA_VERSION = "4.4.0"
POM = Path(__file__).with_name("pom.xml")
MIN_JAVA = 17
SCRAM_MECHANISM = "SCRAM-SHA-512"
SCRAM_USERNAME = "ragflow-sidecar"
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def cache_root() -> Path:
    override = os.environ.get("SIDECAR_CACHE_DIR")
    if override:
        return Path(override)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ragflow-kafka-sidecar"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetch_kafka_jars(version: str = DEFAULT_KAFKA_VERSION) -> Path:
    """The directory of the broker's jars, fetched with Maven the first time."""
    libs = cache_root() / f"kafka-{version}" / "libs"
    if (libs / ".complete").exists():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LocalStackError("Maven (mvn) is needed to fetch Kafka's jars; `make` installs it")
    with _file_lock(libs.parent / ".lock"):
        if (libs / ".complete").exists():
            return libs
        staging = libs.parent / "libs.partial"
        shutil.rmtree(staging, ignore_errors=True)
        command = [
            mvn, "-q", "-B", "-f", str(POM), f"-Dkafka.version={version}",
            "dependency:copy-dependencies", "-DincludeScope=runtime",
            f"-DoutputDirectory={staging}",
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0 or not any(staging.glob(f"kafka_2.13-{version}.jar")):
            output = (result.stdout + result.stderr).strip().splitlines()[-15:]
            raise LocalStackError(
                f"could not fetch org.apache.kafka:kafka_2.13:{version} with Maven:\n"
                + "\n".join(output)
            )
        (staging / ".complete").touch()
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
    return libs


def java_binary() -> str:
    """``java`` from JAVA_HOME or PATH, checked to be version 17 or newer."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise LocalStackError("Java 17 or newer is needed to run Kafka; `make` installs it")
    probe = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)', probe.stderr + probe.stdout)
    if not match or int(match.group(1)) < MIN_JAVA:
        raise LocalStackError(f"{java} is not Java {MIN_JAVA}+: {probe.stderr.strip()[:200]}")
    return java


def _run_coroutine(coro_factory: object) -> object:
    """Run an async check from sync code, even when the caller is inside an event loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro_factory()).result()  # type: ignore[operator]


class LocalKafka:
    """One single-node KRaft broker under ``root``, listening on 127.0.0.1 only."""

    def __init__(
        self,
        root: Path,
        port: int,
        controller_port: int,
        version: str = DEFAULT_KAFKA_VERSION,
        heap_mb: int = 768,
        *,
        sasl_ssl_port: int | None = None,
        principals: tuple[str, ...] = (),
        authorizer: bool = False,
    ) -> None:
        self.root = root
        self.port = port
        self.sasl_ssl_port = sasl_ssl_port
        self.controller_port = controller_port
        self.version = version
        self.heap_mb = heap_mb
        self.home = root / "kafka"
        self.data_dir = self.home / "data"
        self.server_log = root / "logs" / "kafka-server.log"
        self.process = ManagedProcess("kafka", root / "kafka.pid", root / "logs" / "kafka.out")
        self.tls: TlsFiles = tls_files(self.home / "tls")
        self.sasl_username = SCRAM_USERNAME
        # SCRAM users besides the sidecar's, e.g. one per component for ACLs.
        self.principals = principals
        self.authorizer = authorizer
        if (principals or authorizer) and sasl_ssl_port is None:
            raise LocalStackError("SCRAM principals and ACLs need the SASL_SSL listener")
        # Written when the storage is formatted with the SCRAM user, readable by us only.
        self.sasl_password_file = self.home / "sasl-password"

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def secured_bootstrap_servers(self) -> str:
        """The SASL_SSL listener's address (only with ``sasl_ssl_port``)."""
        if self.sasl_ssl_port is None:
            raise LocalStackError("this broker was configured without a SASL_SSL listener")
        return f"127.0.0.1:{self.sasl_ssl_port}"

    def _password_file(self, user: str) -> Path:
        if user == self.sasl_username:
            return self.sasl_password_file
        return self.home / f"sasl-password-{user}"

    def sasl_password(self, user: str | None = None) -> str:
        """A SCRAM user's password (the sidecar's by default), made when the storage was
        formatted."""
        path = self._password_file(user or self.sasl_username)
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise LocalStackError(f"no SCRAM password at {path}") from exc

    def secured_client_env(self, user: str | None = None) -> dict[str, str]:
        """The variables for the SASL_SSL listener as ``user`` (the sidecar's by default), the
        password included."""
        user = user or self.sasl_username
        return {
            "KAFKA_BOOTSTRAP_SERVERS": self.secured_bootstrap_servers,
            "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "KAFKA_SASL_MECHANISM": SCRAM_MECHANISM,
            "KAFKA_SASL_USERNAME": user,
            "KAFKA_SASL_PASSWORD": self.sasl_password(user),
            "KAFKA_SSL_CAFILE": str(self.tls.ca_file),
        }

    def start(self, timeout_s: float = 90.0) -> None:
        """Fetch the jars if needed, format storage on first start, start, wait for metadata."""
        if self.process.pid() is None:
            libs = fetch_kafka_jars(self.version)
            java = java_binary()
            if self.sasl_ssl_port is not None:
                make_tls_files(self.tls.ca_file.parent)
            self._write_config()
            classpath = f"{libs}/*"
            if not (self.data_dir / "meta.properties").exists():
                self._format(java, classpath)
            elif self.sasl_ssl_port is not None and not self.sasl_password_file.exists():
                # SCRAM users are made at format time; this storage was formatted without one.
                raise LocalStackError(
                    f"the Kafka data in {self.data_dir} was formatted without the SCRAM user; "
                    "stop the stack and remove its directory to start it secured"
                )
            self.process.start(
                [
                    java,
                    f"-Xmx{self.heap_mb}m", f"-Xms{min(256, self.heap_mb)}m",
                    "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true",
                    f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
                    "-cp", classpath, "kafka.Kafka", str(self.home / "server.properties"),
                ]
            )  # fmt: skip
        self.wait_ready(timeout_s)

    def _format(self, java: str, classpath: str) -> None:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        scram: list[str] = []
        users = (self.sasl_username, *self.principals) if self.sasl_ssl_port is not None else ()
        for user in users:
            # URL-safe characters only: the tool's [name=...,password=...] syntax has no quoting.
            password = secrets.token_urlsafe(24)
            self._password_file(user).touch(mode=0o600)
            self._password_file(user).write_text(password + "\n")
            scram += ["--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={password}]"]
        result = subprocess.run(
            [
                java, "-Xmx256m", f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
                "-cp", classpath, "kafka.tools.StorageTool", "format",
                # "=" form: a base64 id may start with "-" and read as an option.
                f"--cluster-id={cluster_id}", "--config", str(self.home / "server.properties"),
                *scram,
            ],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            for user in users:
                self._password_file(user).unlink(missing_ok=True)
            raise LocalStackError(f"kafka storage format failed: {result.stderr.strip()[-800:]}")

    def _write_config(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.server_log.parent.mkdir(parents=True, exist_ok=True)
        properties = {
            "process.roles": "broker,controller",
            "node.id": "1",
            # A static voter set rather than 4.x's dynamic quorum (format --standalone): 3.9.x
            # and 4.x format and start alike from this file (the share.coordinator settings
            # below are 4.x's; 3.9 ignores them).
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir),
            # The seed design: topics exist only when init-topics made them.
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "log.retention.hours": "168",
            **self._secured_properties(),
        }
        (self.home / "server.properties").write_text(
            "".join(f"{key}={value}\n" for key, value in properties.items())
        )
        (self.home / "log4j2.properties").write_text(
            "status = warn\n"
            "appender.file.type = File\n"
            "appender.file.name = file\n"
            f"appender.file.fileName = {self.server_log}\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\n"
            "rootLogger.appenderRef.file.ref = file\n"
            "logger.kafka.name = org.apache.kafka\nlogger.kafka.level = INFO\n"
        )

    def _secured_properties(self) -> dict[str, str]:
        """The SASL_SSL listener beside the PLAINTEXT one (brokers and controller stay on it)."""
        if self.sasl_ssl_port is None:
            return {}
        prefix = "listener.name.sasl_ssl."
        return {
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},SASL_SSL://127.0.0.1:{self.sasl_ssl_port},"
                f"CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},SASL_SSL://127.0.0.1:{self.sasl_ssl_port}"
            ),
            "listener.security.protocol.map": (
                "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT"
            ),
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            f"{prefix}sasl.enabled.mechanisms": SCRAM_MECHANISM,
            # The broker side of SCRAM needs no credentials of its own: it checks the clients'
            # against the users stored in the metadata log.
            f"{prefix}{SCRAM_MECHANISM.lower()}.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            f"{prefix}ssl.keystore.type": "PEM",
            f"{prefix}ssl.keystore.location": str(self.tls.keystore),
            f"{prefix}ssl.client.auth": "none",
            **(
                {"authorizer.class.name": STANDARD_AUTHORIZER, "super.users": "User:ANONYMOUS"}
                if self.authorizer
                else {}
            ),
        }

    def wait_ready(self, timeout_s: float) -> None:
        self.process.wait_until(
            self.answers, timeout_s, 0.2, what="answer a metadata request",
            exited_note=f"\n(broker log: {self.server_log})",
        )  # fmt: skip

    def answers(self) -> bool:
        """True when a metadata request lists this broker."""
        # A closed port is checked first so that aiokafka does not log a connection error
        # for every probe while the JVM is still starting.
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False

        async def probe() -> bool:
            admin = AIOKafkaAdminClient(
                bootstrap_servers=self.bootstrap_servers, request_timeout_ms=3000
            )
            try:
                await admin.start()
                cluster = await admin.describe_cluster()
                return bool(cluster.get("brokers"))
            except Exception:  # any failure means "not yet"
                return False
            finally:
                await admin.close()

        return bool(_run_coroutine(probe))

    def running_version(self) -> str:
        """The version the running broker reports in its log."""
        try:
            text = self.server_log.read_text(errors="replace")
        except OSError:
            return "unknown"
        versions = re.findall(r"Kafka version: (\S+)", text)
        return versions[-1] if versions else "unknown"

    def stop(self) -> bool:
        return self.process.stop(timeout_s=30.0)

    def kill(self) -> None:
        self.process.kill()
