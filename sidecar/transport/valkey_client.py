"""Valkey clients for the sidecar: how they are made, and Valkey's errors as the sidecar's."""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

import valkey.asyncio as valkey
from valkey import exceptions as valkey_errors
from valkey.asyncio.connection import Connection, SSLConnection

from sidecar.errors import (
    AuthenticationError,
    MessageQueueError,
    ServerFullError,
    ServiceUnavailableError,
    SidecarError,
)
from sidecar.transport.options import RedisSettings

# A reply that never comes fails the call after this long. valkey-py's own default, since 6.1;
# before it (RAGFlow pins 6.0.2, under which ragflow_mq runs) there was none, and a Valkey that
# stopped answering held the call, and the RAGFlow thread in it, for good.
SOCKET_TIMEOUT_S = 5.0


def create_client(settings: RedisSettings, **overrides: Any) -> valkey.Valkey:
    """A Valkey client on raw bytes (values must reach Kafka exactly as stored)."""
    options: dict[str, Any] = {
        **settings.client_kwargs(),
        "decode_responses": False,
        "socket_connect_timeout": 5,
        "socket_timeout": SOCKET_TIMEOUT_S,
        "health_check_interval": 30,
    }
    options.update(overrides)
    client = valkey.Valkey(**options)
    if _LIBVALKEY is not None:
        pool = client.connection_pool
        pool.connection_class = _C_PACKING.get(pool.connection_class, pool.connection_class)
    return client


# Only with the sidecar's extra (pyproject.toml): RAGFlow's processes, which run ragflow_mq and
# this module, get no libvalkey, so valkey-py keeps its own parser for RAGFlow's connections.
# Looked up, not imported by name, for that reason.
_LIBVALKEY: Any = (
    importlib.import_module("libvalkey") if importlib.util.find_spec("libvalkey") else None
)


class _CPacking:
    """Commands packed by libvalkey's C packer (the sidecar's extra installs it), which
    valkey-py's asyncio connections do not use. Their packer, in Python, was a tenth of the
    sidecar's CPU: the join's batch scripts carry thousands of arguments."""

    encoder: Any

    def pack_command(self, *args: Any) -> list[bytes]:
        encoder = self.encoder
        if encoder.encoding.lower() in ("utf-8", "utf8") and encoder.encoding_errors == "strict":
            # The command name may carry literal arguments ("CONFIG GET"), sent apart.
            name = args[0]
            words = (name.encode() if isinstance(name, str) else name).split()
            try:
                return [_LIBVALKEY.pack_command((*words, *args[1:]))]
            except TypeError:
                pass  # None, a bool, ...: valkey-py's packer raises its own DataError
        packed: list[bytes] = super().pack_command(*args)  # type: ignore[misc]
        return packed


class _CPackingConnection(_CPacking, Connection):
    pass


class _CPackingSSLConnection(_CPacking, SSLConnection):
    pass


_C_PACKING: dict[type[Any], type[Any]] = {
    Connection: _CPackingConnection,
    SSLConnection: _CPackingSSLConnection,
}


# valkey-py prefixes an error in a pipeline with the whole command, arguments and all: task
# bytes and join facts, kilobytes of them, that must not end up in an error line or a log.
_PIPELINE_ERROR = re.compile(
    r"^Command # \d+ \((?P<command>\S+).*?\) of pipeline caused error: (?P<error>.*)$", re.S
)


# Valkey's reply to a write at maxmemory; valkey-py strips the "OOM " code from its message.
_OOM = "command not allowed when used memory > 'maxmemory'"


def _reason(exc: valkey_errors.ValkeyError) -> str:
    """The server's error, without the arguments valkey-py adds to one from a pipeline."""
    text = str(exc)
    match = _PIPELINE_ERROR.match(text)
    if match is None:
        return text
    # The error can come as the repr of a one-element tuple: ("...",).
    error = match["error"].strip("\"'(),")
    return f"{match['command']} in a pipeline: {error}"


def translate_valkey_errors(action: str, where: str) -> _ValkeyErrors:
    """A context manager turning valkey-py's exceptions into the sidecar's, naming what was
    being done."""
    return _ValkeyErrors(action, where)


class _ValkeyErrors:
    """:func:`translate_valkey_errors`'s context manager: a class, not a generator, since the
    shadow enters one per task (a generator-based one cost 1.5 µs a time)."""

    __slots__ = ("_action", "_where")

    def __init__(self, action: str, where: str) -> None:
        self._action = action
        self._where = where

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            translated = _translated(exc, self._action, self._where)
            if translated is not None:
                raise translated from exc


def _translated(exc: BaseException, action: str, where: str) -> SidecarError | None:
    """The sidecar's error for one of valkey-py's (or a socket's), naming ``action``; ``None``
    for anything else, which goes on as it is."""
    if isinstance(exc, valkey_errors.AuthenticationError | valkey_errors.AuthorizationError):
        return AuthenticationError(f"Valkey at {where} refused our credentials: {exc}")
    if not isinstance(exc, valkey_errors.ValkeyError):
        if isinstance(exc, OSError):
            return ServiceUnavailableError(f"cannot reach Valkey at {where} to {action}: {exc}")
        return None
    reason = _reason(exc)
    # A command refused inside a Lua script comes back as a plain error, not NOPERM.
    if isinstance(exc, valkey_errors.NoPermissionError) or "ACL failure" in reason:
        return AuthenticationError(
            f"Valkey at {where}: the user may not {action} ({reason}); see docs/security.md"
        )
    if isinstance(exc, valkey_errors.OutOfMemoryError) or _OOM in reason:
        # A write refused at maxmemory (noeviction), also from inside a Lua script.
        return ServerFullError(
            f"Valkey at {where} is at its maxmemory and refused to {action}: {reason}"
        )
    if isinstance(exc, valkey_errors.ConnectionError | valkey_errors.TimeoutError):
        return ServiceUnavailableError(f"cannot reach Valkey at {where} to {action}: {reason}")
    return MessageQueueError(f"Valkey at {where} failed to {action}: {reason}")


async def ping(settings: RedisSettings) -> str:
    """Connect once and return the server's version; raises ``SidecarError`` otherwise."""
    client = create_client(settings)
    try:
        with translate_valkey_errors("PING", settings.display_url):
            await client.ping()
            info = await client.info("server")
        return str(info.get("valkey_version") or info.get("redis_version") or "unknown")
    finally:
        await client.aclose()


class ClientOwner:
    """A client given by the caller, or one of its own made from settings at start."""

    def __init__(self, client: valkey.Valkey | None, settings: RedisSettings | None) -> None:
        if client is None and settings is None:
            raise ValueError("give a Valkey client or RedisSettings")
        self._given_client = client
        self._settings = settings
        self._client: valkey.Valkey | None = client
        self._where = settings.display_url if settings else "the given client"

    @property
    def client(self) -> valkey.Valkey:
        if self._client is None:
            raise RuntimeError("not started")
        return self._client

    @asynccontextmanager
    async def _calls(self, action: str) -> AsyncIterator[None]:
        with translate_valkey_errors(action, self._where):
            yield

    def _open(self) -> None:
        if self._client is None:
            assert self._settings is not None
            self._client = create_client(self._settings)

    async def _close(self) -> None:
        # A client we were given belongs to the caller, who closes it.
        if self._given_client is None and self._client is not None:
            await self._client.aclose()
            self._client = None
