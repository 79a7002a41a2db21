"""The HTTP endpoint on ``SIDECAR_METRICS_PORT``: ``/metrics``, ``/healthz`` and ``/readyz``.

``/healthz`` is 200 while no component's loop has died (a supervisor restarts the process
otherwise); ``/readyz`` is 200 once every component has started, which means connected to
Valkey and Kafka, and while all of them run. A tiny asyncio HTTP/1.1 server: three GET routes
do not need a web framework, and it runs on the sidecar's own event loop, so a stuck loop also
shows as a probe that times out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sidecar.errors import ConfigError
from sidecar.mq.base import Lifecycle

logger = logging.getLogger(__name__)

MAX_REQUEST_LINE = 8192


class Health:
    """Which components are started, running or dead; read by the probes and the up gauge."""

    def __init__(self, components: tuple[str, ...]) -> None:
        self.components = components
        self.running: dict[str, bool] = dict.fromkeys(components, False)
        self.died: dict[str, str] = {}

    def set_running(self, component: str, running: bool) -> None:
        self.running[component] = running

    def set_died(self, component: str, reason: str) -> None:
        self.running[component] = False
        self.died[component] = reason

    @property
    def healthy(self) -> bool:
        return not self.died

    @property
    def ready(self) -> bool:
        return self.healthy and all(self.running.values())

    def summary(self) -> str:
        parts = [f"{name}={'up' if up else 'down'}" for name, up in self.running.items()]
        parts += [f"{name} died: {reason}" for name, reason in self.died.items()]
        return " ".join(parts)


class HealthServer(Lifecycle):
    """Serves the probes and the Prometheus exposition of ``registry``."""

    def __init__(self, host: str, port: int, health: Health, registry: CollectorRegistry):
        super().__init__()
        self._host, self._port = host, port
        self._health = health
        self._registry = registry
        self._server: asyncio.Server | None = None

    def attach(self, health: Health, registry: CollectorRegistry) -> None:
        """Serve these from now on: a server kept across in-process restarts shows each new
        build's state, and the last one's (a loop died) until the next build attaches."""
        self._health, self._registry = health, registry

    @property
    def port(self) -> int:
        """The port bound (the one asked for, or the one chosen for port 0)."""
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def _start(self) -> None:
        try:
            self._server = await asyncio.start_server(self._serve, self._host, self._port)
        except OSError as exc:
            raise ConfigError(
                "SIDECAR_METRICS_PORT", f"cannot listen on {self._host}:{self._port}: {exc}"
            ) from exc
        logger.info("metrics and health on http://%s:%d/metrics", self._host, self.port)

    async def _stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), timeout=5)
            while (await asyncio.wait_for(reader.readline(), timeout=5)) not in (
                b"\r\n",
                b"\n",
                b"",
            ):
                pass  # headers: none of them matter here
            status, content_type, body = self._respond(line[:MAX_REQUEST_LINE])
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _respond(self, request_line: bytes) -> tuple[str, str, bytes]:
        parts = request_line.decode("latin-1").split()
        if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"GET only\n"
        path = parts[1].split("?", 1)[0]
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self._registry)
        if path == "/healthz":
            ok = self._health.healthy
        elif path == "/readyz":
            ok = self._health.ready
        else:
            return "404 Not Found", "text/plain", b"try /metrics, /healthz or /readyz\n"
        body = f"{'ok' if ok else 'not ok'}: {self._health.summary()}\n".encode()
        return ("200 OK" if ok else "503 Service Unavailable"), "text/plain", body
