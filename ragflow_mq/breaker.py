"""The producer's breaker: after a produce that failed or overran ``SERVE_ENQUEUE_TIMEOUT_MS``,
served tasks go to Redis for ``SERVE_BREAKER_OPEN_S``; then one task at a time probes Kafka
(half-open) until one is acknowledged in time. Per process: each RAGFlow process finds out for
itself, at the cost of one bounded try."""

from __future__ import annotations

import logging
import threading
import time
from enum import StrEnum

logger = logging.getLogger(__name__)


class BreakerState(StrEnum):
    CLOSED = "closed"  # Kafka takes served tasks
    OPEN = "open"  # served tasks go to Redis
    HALF_OPEN = "half_open"  # one probe in flight; the others go to Redis


class Breaker:
    """Thread-safe: RAGFlow's API may enqueue from several threads."""

    def __init__(self, open_s: float) -> None:
        self._open_s = open_s
        self._lock = threading.Lock()
        self.state = BreakerState.CLOSED
        self._until = 0.0

    def allow(self) -> bool:
        """Whether this task may try Kafka (a half-open probe counts as allowed)."""
        with self._lock:
            if self.state is BreakerState.CLOSED:
                return True
            if self.state is BreakerState.OPEN and time.monotonic() >= self._until:
                self.state = BreakerState.HALF_OPEN
                return True
            return False

    def succeeded(self) -> None:
        with self._lock:
            if self.state is not BreakerState.CLOSED:
                logger.info(
                    "ragflow_mq: Kafka acknowledged a task again; served tasks back on Kafka"
                )
            self.state = BreakerState.CLOSED

    def failed(self) -> None:
        with self._lock:
            if self.state is not BreakerState.OPEN:
                logger.warning(
                    "ragflow_mq: Kafka did not take a task in time; served tasks go to Redis "
                    "for %g s",
                    self._open_s,
                )
            self.state = BreakerState.OPEN
            self._until = time.monotonic() + self._open_s
