"""Connection options for the client layer: where Valkey and Kafka are and how to log in.

Plain values with no knowledge of the application's configuration; ``sidecar.config`` builds
them from the environment and the transport clients take them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote, unquote, urlsplit

from aiokafka.helpers import create_ssl_context

from sidecar.errors import ConfigError

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]

SECURITY_PROTOCOLS: tuple[str, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
COMPRESSION_TYPES: tuple[str, ...] = ("none", "gzip", "snappy", "lz4", "zstd")
REDIS_SCHEMES: tuple[str, ...] = ("redis", "rediss", "valkey", "valkeys")

# RAGFlow keeps its queue in logical DB 1 (service_conf.yaml redis.db), so a URL without a
# path means db 1 here, not Redis's usual 0.
RAGFLOW_REDIS_DB = 1


class Secret:
    """A string that does not show itself: repr and str print ``***``."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret itself, for handing to a client library and nowhere else."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    def __str__(self) -> str:
        return "***"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class RedisSettings:
    """Where a Valkey/Redis is: RAGFlow's (``REDIS_URL``) or the sidecar's state store
    (``SIDECAR_STATE_URL``), parsed from a URL."""

    host: str = "localhost"
    port: int = 6379
    db: int = RAGFLOW_REDIS_DB
    username: str | None = None
    password: Secret | None = None
    tls: bool = False

    @classmethod
    def from_url(cls, url: str, variable: str = "REDIS_URL") -> RedisSettings:
        """Parse ``redis://``, ``rediss://``, ``valkey://`` or ``valkeys://`` URLs."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ConfigError(variable, f"not a valid URL ({exc})") from exc
        if parts.scheme not in REDIS_SCHEMES:
            raise ConfigError(
                variable,
                f"unsupported scheme {parts.scheme or '(none)'!r}; "
                f"use one of {', '.join(s + '://' for s in REDIS_SCHEMES)}",
            )
        if not parts.hostname:
            raise ConfigError(variable, "has no host name")
        db_text = parts.path.lstrip("/")
        if db_text:
            if not db_text.isdigit():
                raise ConfigError(variable, f"database {db_text!r} is not a number")
            db = int(db_text)
        else:
            db = RAGFLOW_REDIS_DB
        password = unquote(parts.password) if parts.password else None
        return cls(
            host=parts.hostname,
            port=port or 6379,
            db=db,
            username=unquote(parts.username) if parts.username else None,
            password=Secret(password) if password else None,
            tls=parts.scheme in ("rediss", "valkeys"),
        )

    @property
    def display_url(self) -> str:
        """The URL with the password masked, for logs and status output."""
        scheme = "rediss" if self.tls else "redis"
        auth = ""
        if self.username or self.password:
            auth = quote(self.username or "", safe="") + (":***" if self.password else "") + "@"
        return f"{scheme}://{auth}{self.host}:{self.port}/{self.db}"

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``valkey.asyncio.Valkey``."""
        return {
            "host": self.host,
            "port": self.port,
            "db": self.db,
            "username": self.username,
            "password": self.password.reveal() if self.password else None,
            "ssl": self.tls,
        }


@dataclass(frozen=True)
class KafkaSettings:
    """How to reach Kafka and the defaults for what the sidecar creates there."""

    bootstrap_servers: tuple[str, ...] = ("localhost:9092",)
    client_id: str = "ragflow-kafka-sidecar"
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    sasl_username: str | None = None
    sasl_password: Secret | None = field(default=None)
    ssl_cafile: str | None = None
    consumer_group: str = "ragflow-task-executor"
    default_partitions: int = 4
    replication_factor: int = 1
    compression_type: str | None = "gzip"
    linger_ms: int = 5
    # The producer's largest batch per partition (aiokafka's max_batch_size; Kafka's
    # batch.size), before compression. aiokafka's 16 KiB default made a produce request of
    # every ~25 tasks, and a request costs ~1 ms of the producer's CPU however few records it
    # carries: the mirror alone went from ~11,000 to ~15,500 tasks/s at 512 KiB.
    batch_bytes: int = 524_288
    request_timeout_ms: int = 30000

    def client_kwargs(self) -> dict[str, Any]:
        """Connection and security keyword arguments shared by aiokafka's clients."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": list(self.bootstrap_servers),
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
        }
        if self.security_protocol in ("SSL", "SASL_SSL"):
            kwargs["ssl_context"] = create_ssl_context(cafile=self.ssl_cafile)
        if self.security_protocol.startswith("SASL_"):
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = (
                self.sasl_password.reveal() if self.sasl_password else None
            )
        return kwargs
