"""What one executor holds of the served path, shared by RAGFlow's thread and the loop's: the
records claimed and waiting for a slot (per RAGFlow queue), the tasks handed out, and the
tasks acked whose done marker is not written yet."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from sidecar.transport.message import QueueMessage
from sidecar.wire.contract import QUEUE_HEADER


def queue_of(message: QueueMessage) -> str:
    """The RAGFlow queue a served record was produced for (``x-ragflow-queue``), or ''."""
    queue = message.header(QUEUE_HEADER)
    return queue.decode("utf-8", "replace") if queue is not None else ""


class KafkaTask:
    """What ``queue_consumer`` returns for a served record: RAGFlow's ``RedisMsg`` interface."""

    def __init__(
        self,
        message: QueueMessage,
        task: dict[str, Any],
        on_ack: Callable[[KafkaTask], None],
        *,
        retaken: bool = False,
        replayed: bool = False,
    ) -> None:
        self.message = message
        self._task = task
        # Taken over from an executor that died holding it: maybe what killed it.
        self.retaken = retaken
        # Taken from a pending list: its record was committed past, there is nothing to commit.
        self.replayed = replayed
        self._on_ack = on_ack
        self.handed_out_s = time.time()
        self._acked = False

    def get_message(self) -> dict[str, Any]:
        return self._task

    def get_msg_id(self) -> str:
        return self.message.id

    @property
    def task_id(self) -> str:
        return str(self._task.get("id"))

    @property
    def queue_wait_ms(self) -> float:
        """From the record's enqueue to its hand-out."""
        return self.handed_out_s * 1000 - self.message.timestamp_ms

    @property
    def acked(self) -> bool:
        return self._acked

    def ack(self) -> bool:
        """Mark the task done; its done marker and offset are written in the background."""
        if not self._acked:
            self._acked = True
            self._on_ack(self)
        return True


class Hand:
    """Thread-safe; every method takes the one lock."""

    def __init__(self, queues: Sequence[str]) -> None:
        self._queues = tuple(queues)
        self._lock = threading.Lock()
        self._buffers: dict[str, deque[KafkaTask]] = {queue: deque() for queue in self._queues}
        self._in_hand: dict[str, KafkaTask] = {}  # message id -> task handed out, not acked
        self._finishing: set[str] = set()  # task ids acked, done marker not yet written
        # Task ids RAGFlow gave up on (handed out, never acked): pending for this consumer name,
        # never handed out again by this process, as Redis replays a pending entry only to
        # its consumer's next start.
        self._given_up: set[str] = set()

    def knows(self, queue: str) -> bool:
        return queue in self._buffers

    def filled(self) -> int:
        """Slots this executor's served tasks fill or are about to: waiting plus in hand."""
        with self._lock:
            return sum(len(b) for b in self._buffers.values()) + len(self._in_hand)

    def in_hand(self) -> int:
        with self._lock:
            return len(self._in_hand)

    def held(self) -> set[str]:
        """Task ids waiting, in hand, or acked and not yet marked done: a second record of
        one of them is parked, not run."""
        with self._lock:
            ids = {task.task_id for buffer in self._buffers.values() for task in buffer}
            ids |= {task.task_id for task in self._in_hand.values()}
            return ids | self._finishing | self._given_up

    def wait(self, queue: str, task: KafkaTask) -> None:
        """``task`` waits for a slot; an unknown queue (not in MIRROR_STREAMS) is served with
        the lowest priority rather than left unread."""
        with self._lock:
            self._buffers[queue if queue in self._buffers else self._queues[-1]].append(task)

    def take(self, queue: str) -> KafkaTask | None:
        """The first waiting task of ``queue``, except that a retaken task waits while another
        retaken one runs: a task that kills its executor then dies alone, and the tasks that
        died beside it run once more and finish instead of dying with it again, three times,
        until RAGFlow's retry_count abandons them too."""
        with self._lock:
            buffer = self._buffers[queue]
            suspect_running = any(task.retaken for task in self._in_hand.values())
            for index, task in enumerate(buffer):
                if task.retaken and suspect_running:
                    continue
                del buffer[index]
                task.handed_out_s = time.time()
                self._in_hand[task.message.id] = task
                return task
            return None

    def acked(self, task: KafkaTask) -> None:
        with self._lock:
            self._finishing.add(task.task_id)
            self._in_hand.pop(task.message.id, None)

    def give_up(self, task: KafkaTask) -> bool:
        """RAGFlow let ``task`` go unacked: its slot is free. False when it was acked."""
        with self._lock:
            if self._in_hand.pop(task.message.id, None) is None:
                return False
            self._given_up.add(task.task_id)
            return True

    def marked_done(self, tasks: Sequence[KafkaTask]) -> None:
        with self._lock:
            for task in tasks:
                self._finishing.discard(task.task_id)

    def drop_waiting(self, dropped: Callable[[KafkaTask], bool] = lambda t: True) -> list[str]:
        """Take the waiting tasks ``dropped`` names out; their task ids."""
        with self._lock:
            ids: list[str] = []
            for queue, buffer in self._buffers.items():
                ids += [task.task_id for task in buffer if dropped(task)]
                self._buffers[queue] = deque(t for t in buffer if not dropped(t))
            return ids
