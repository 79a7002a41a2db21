"""The HTTP endpoint on ``SIDECAR_METRICS_PORT``: ``/metrics``, ``/healthz`` and ``/readyz``.

``/healthz`` (liveness) is 200 while the process serves and no loop is wedged: one that has
not turned for ``HEALTH_WEDGED_S``. Valkey or Kafka away is not a reason to restart the
process (it rebuilds itself when they are back), so it does not fail liveness. ``/readyz``
(readiness) is 200 once every component has started, which means connected to Valkey and
Kafka, and while all of them run. A tiny asyncio HTTP/1.1 server: three GET routes
do not need a web framework, and it runs on the sidecar's own event loop, so a stuck loop also
shows as a probe that times out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sidecar.errors import ConfigError
from sidecar.lifecycle import Lifecycle

logger = logging.getLogger(__name__)

MAX_REQUEST_LINE = 8192


class Health:
    """Which components are started, running or dead; read by the probes and the up gauge."""

    def __init__(self, components: tuple[str, ...]) -> None:
        self.components = components
        self.running: dict[str, bool] = dict.fromkeys(components, False)
        self.died: dict[str, str] = {}
        self.wedged: dict[str, float] = {}  # component -> seconds since its loop last turned
        self.unreachable: dict[str, str] = {}  # dependency (valkey, kafka) -> why
        self._turns: dict[str, tuple[int, float]] = {}  # component -> (turns, when they moved)

    def note_turns(self, component: str, turns: int, now: float, wedged_after_s: float) -> None:
        """Told the loop's turn count every so often; a count that stays put while the loop
        runs for ``wedged_after_s`` marks it wedged, until it moves again."""
        seen = self._turns.get(component)
        if seen is None or seen[0] != turns or not self.running.get(component):
            self._turns[component] = (turns, now)
            self.wedged.pop(component, None)
            return
        stalled_s = now - seen[1]
        if stalled_s >= wedged_after_s:
            self.wedged[component] = stalled_s

    def set_running(self, component: str, running: bool) -> None:
        self.running[component] = running

    def set_died(self, component: str, reason: str) -> None:
        self.running[component] = False
        self.died[component] = reason

    @property
    def healthy(self) -> bool:
        """Liveness: no loop wedged (a loop that died of an outage is being rebuilt)."""
        return not self.wedged

    def set_reachable(self, dependency: str, problem: str | None) -> None:
        """What the last check of Valkey or Kafka found: ``None`` when it answered."""
        if problem is None:
            self.unreachable.pop(dependency, None)
        else:
            self.unreachable[dependency] = problem

    @property
    def ready(self) -> bool:
        return (
            self.healthy and not self.died and not self.unreachable and all(self.running.values())
        )

    def summary(self) -> str:
        parts = [f"{name}={'up' if up else 'down'}" for name, up in self.running.items()]
        parts += [f"{name} died: {reason}" for name, reason in self.died.items()]
        parts += [f"{name} wedged for {s:.0f} s" for name, s in self.wedged.items()]
        parts += [f"{name} unreachable: {why}" for name, why in self.unreachable.items()]
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
