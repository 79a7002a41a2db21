"""RAGFlow's ``service_conf.yaml`` as a source of settings: its ``redis:``, ``kafka:`` and ``mq:``
sections, with ``${VAR:-default}`` expansion as RAGFlow's template uses it.

Each file key becomes the variable it stands for; a variable set in the environment wins.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from sidecar.config.env import Value
from sidecar.errors import ConfigError
from sidecar.transport.options import RAGFLOW_REDIS_DB

# service_conf.yaml key -> variable. Only the sections the seed design adds are checked for
# unknown keys: RAGFlow's own `redis:` section carries keys that are not ours.
KAFKA_FILE_KEYS: dict[str, str] = {
    "bootstrap_servers": "KAFKA_BOOTSTRAP_SERVERS",
    "client_id": "KAFKA_CLIENT_ID",
    "security_protocol": "KAFKA_SECURITY_PROTOCOL",
    "sasl_mechanism": "KAFKA_SASL_MECHANISM",
    "sasl_username": "KAFKA_SASL_USERNAME",
    "sasl_password": "KAFKA_SASL_PASSWORD",
    "ssl_cafile": "KAFKA_SSL_CAFILE",
    "default_partitions": "KAFKA_DEFAULT_PARTITIONS",
    "replication_factor": "KAFKA_REPLICATION_FACTOR",
    "compression_type": "KAFKA_COMPRESSION_TYPE",
    "linger_ms": "KAFKA_LINGER_MS",
    "batch_bytes": "KAFKA_BATCH_BYTES",
    "request_timeout_ms": "KAFKA_REQUEST_TIMEOUT_MS",
}
MQ_FILE_KEYS: dict[str, str] = {
    "backend": "MQ_BACKEND",
    "consumer_group": "KAFKA_CONSUMER_GROUP",
}
# The variables a file may set: REDIS_URL comes from the whole `redis:` section.
FILE_VARIABLES: tuple[str, ...] = ("REDIS_URL", *KAFKA_FILE_KEYS.values(), *MQ_FILE_KEYS.values())

_EXPANSION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_variables(text: str, environ: Mapping[str, str]) -> str:
    """Expand ``${VAR}`` and ``${VAR:-default}`` (default when VAR is unset or empty)."""

    def replace(match: re.Match[str]) -> str:
        value = environ.get(match.group(1), "")
        return value if value != "" else (match.group(2) or "")

    return _EXPANSION.sub(replace, text)


def read_service_conf(path: Path, environ: Mapping[str, str]) -> dict[str, Value]:
    """The file's settings by variable, each naming the file key it came from."""
    label = f"--config {path}"
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(label, f"cannot read file ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(label, f"not valid YAML ({exc})") from exc
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(label, "must be a YAML mapping of sections")

    values: dict[str, Value] = {}

    def section(name: str) -> dict[str, Any]:
        body = document.get(name)
        if body is None:
            return {}
        if not isinstance(body, dict):
            raise ConfigError(f"{path.name} {name}", "must be a mapping")
        return body

    def scalar(key: str, raw: Any) -> str:
        if isinstance(raw, dict | list):
            raise ConfigError(f"{path.name} {key}", "must be a single value")
        return expand_variables(str(raw), environ).strip() if raw is not None else ""

    for prefix, keys in (("kafka", KAFKA_FILE_KEYS), ("mq", MQ_FILE_KEYS)):
        for key, raw in section(prefix).items():
            variable = keys.get(str(key))
            if variable is None:
                raise ConfigError(
                    f"{path.name} {prefix}.{key}",
                    f"unknown key; known keys are {', '.join(sorted(keys))}",
                )
            text = scalar(f"{prefix}.{key}", raw)
            if text:
                values[variable] = Value(text, f"{path.name} {prefix}.{key}")

    redis = section("redis")
    if redis:
        url = _redis_url_from_section(redis, scalar)
        values["REDIS_URL"] = Value(url, f"{path.name} redis")
    return values


def _redis_url_from_section(redis: dict[str, Any], scalar: Callable[[str, Any], str]) -> str:
    """RAGFlow writes ``host: 'redis:6379'`` with ``db`` and ``password`` beside it."""
    host = scalar("redis.host", redis.get("host", "localhost")) or "localhost"
    db = scalar("redis.db", redis.get("db", RAGFLOW_REDIS_DB)) or str(RAGFLOW_REDIS_DB)
    username = scalar("redis.username", redis.get("username"))
    password = scalar("redis.password", redis.get("password"))
    auth = ""
    if username or password:
        auth = f"{quote(username, safe='')}:{quote(password, safe='')}@"
    if ":" not in host:
        host = f"{host}:6379"
    return f"redis://{auth}{host}/{db}"
