"""What every benchmark shares: free ports, the load average, a local stack of its own."""

from __future__ import annotations

import socket
from pathlib import Path

from sidecar.local_stack import LocalStack, StackConfig


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages: the machine may be shared, so each line has them."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def bench_stack(root: Path) -> LocalStack:
    """A Valkey and a Kafka of the bench's own under ``root``, on free ports of 127.0.0.1."""
    return LocalStack(StackConfig(root, free_port(), free_port(), free_port()))
