"""What every benchmark shares: free ports, the load average, a local stack of its own."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import valkey

from sidecar.dev.local_stack import LocalStack, StackConfig
from sidecar.dev.samples import ragflow_tasks
from sidecar.transport.message import encode_task

_SIDECAR_PREFIXES = ("KAFKA_", "MIRROR_", "REDIS_", "SHADOW_", "SIDECAR_", "OTEL_")


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


def environment_without_sidecar_settings() -> dict[str, str]:
    """This process's environment less every variable the sidecar reads, for a child sidecar
    configured by the bench alone."""
    return {k: v for k, v in os.environ.items() if not k.startswith(_SIDECAR_PREFIXES)}


def fill(url: str, stream: str, count: int) -> None:
    """XADD ``count`` RAGFlow-shaped tasks of all five kinds, pipelined 5,000 at a time."""
    client = valkey.Valkey.from_url(url)
    tasks = ragflow_tasks(count)
    for start in range(0, count, 5000):
        pipe = client.pipeline(transaction=False)
        for task in tasks[start : start + 5000]:
            pipe.xadd(stream, {"message": encode_task(task)})
        pipe.execute()
    client.close()
