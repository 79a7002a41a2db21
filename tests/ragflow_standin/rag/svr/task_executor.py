"""Stand-in of RAGFlow's ``rag/svr/task_executor.py``: its queue loop, with a fake workload.

Run as ``python -m rag.svr.task_executor [-i INDEX] [-t common]`` with ``tests/ragflow_standin``
on PYTHONPATH. As in RAGFlow, the module then runs as ``__main__``: code that wants to wrap the
running executor's ``set_progress`` must find it in ``sys.modules["__main__"]``.

Faithful to RAGFlow: ``collect()`` (own pending entries once per process through
``get_unacked_iterator``, then ``queue_consumer`` over the queues priority first, stopping at the
first message), ``handle_task()`` (``set_progress(prog=-1)`` looked up as a module global on
failure; ack after success and failure alike; ack early for an empty, unknown or cancelled task),
MAX_CONCURRENT_TASKS coroutines sharing one consumer name, a sleep when idle.

Differences, on purpose:
- The task is the message itself (RAGFlow loads the Task row from its DB). ``get_task`` keeps
  RAGFlow's rule on a hash in Valkey, ``<STANDIN_RESULTS_KEY>:retry_count``: each delivery adds
  1, and a delivery that finds 3 already abandons the task (acked, progress -1 recorded in
  ``<STANDIN_RESULTS_KEY>:abandoned``).
- ``<STANDIN_RESULTS_KEY>:db_down``, a count set by a test: while above 0, ``get_task`` takes
  one off it and raises as RAGFlow's does when MySQL is away (2003, not retried), right after
  ``queue_consumer``, outside any try: the message is never acked, only the slot is freed.
- A task whose id is in the set ``<STANDIN_RESULTS_KEY>:poison`` kills its executor
  (``os._exit(17)``, as an out-of-memory kill would) after its execution is recorded.
- ``do_handle_task`` records each execution (RPUSH to ``STANDIN_RESULTS_KEY``) and sleeps
  ``STANDIN_WORK_MS``; ``set_progress`` records to ``<STANDIN_RESULTS_KEY>:progress``.
- SIGTERM/SIGINT stop taking work, let the tasks in hand finish and ack, and exit 0. RAGFlow's
  handler sleeps 1 s and calls ``sys.exit(0)``, which cancels the tasks in hand unacked; set
  ``STANDIN_STOP_MODE=ragflow`` for that (cancel after 1 s, exit 0).
- The heartbeat is simplified and off unless ``STANDIN_HEARTBEAT_S`` > 0: every so many seconds
  ``queue_info`` on the priority-0 queue, ``SADD TASKEXE <name>`` and ``ZADD <name>`` of a JSON
  line; no cleaning of other executors, no Redis lock.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import copy
import json
import logging
import os
import signal
import socket
import sys
import time
import zlib
from datetime import datetime
from typing import Any

import valkey
from common import settings
from common.constants import SVR_CONSUMER_GROUP_NAME

from rag.utils.redis_conn import REDIS_CONN, RedisMsg, standin_redis_url

Task = dict[str, Any]

# RAGFlow keeps these in rag/svr/task_executor_limiter.py (task_limiter is a semaphore of this size).
MAX_CONCURRENT_TASKS = int(os.environ.get("MAX_CONCURRENT_TASKS", "5"))
# RAGFlow sleeps 5 s (asyncio.sleep(5) in handle_task) when collect() found nothing.
IDLE_SLEEP_S = float(os.environ.get("STANDIN_IDLE_SLEEP_S", "0.05"))
WORK_MS = float(os.environ.get("STANDIN_WORK_MS", "0"))
FAIL_PERCENT = float(os.environ.get("STANDIN_FAIL_PERCENT", "0"))
FAIL_KAFKA_PERCENT = float(os.environ.get("STANDIN_FAIL_KAFKA_PERCENT", "0"))
RESULTS_KEY = os.environ.get("STANDIN_RESULTS_KEY", "standin:results")
STOP_MODE = os.environ.get("STANDIN_STOP_MODE", "graceful")
HEARTBEAT_S = float(os.environ.get("STANDIN_HEARTBEAT_S", "0"))

UNACKED_ITERATOR: Any = None
TASK_TYPE = "common"
TE_IDX = f"{socket.gethostname()}_0"
# RAGFlow: f"task_executor_{TASK_TYPE}_{TE_IDX}", TE_IDX being "<host id>_<n>" (-i).
CONSUMER_NAME = os.environ.get("STANDIN_CONSUMER") or f"task_executor_{TASK_TYPE}_{TE_IDX}"

BOOT_AT = datetime.now().astimezone().isoformat(timespec="milliseconds")
DONE_TASKS = 0
FAILED_TASKS = 0
CURRENT_TASKS: dict[str, Task] = {}

stop_event = asyncio.Event()
_current_msg: contextvars.ContextVar[RedisMsg | None] = contextvars.ContextVar(
    "current_msg", default=None
)
_results: valkey.StrictRedis | None = None


class TaskCanceledException(Exception):
    pass


class InjectedFault(RuntimeError):
    """Raised by ``do_handle_task`` for the share of tasks chosen by the STANDIN_FAIL_* knobs."""


def _results_client() -> valkey.StrictRedis:
    """A client of its own for the records, so that patches of REDIS_CONN never touch them."""
    global _results  # noqa: PLW0603
    if _results is None:
        _results = valkey.StrictRedis.from_url(standin_redis_url(), decode_responses=True)
    return _results


def has_canceled(task_id: str) -> bool:
    try:
        if REDIS_CONN.get(f"{task_id}-cancel"):
            logging.info("Task: %s has been canceled", task_id)
            return True
    except Exception as e:
        logging.exception(e)
    return False


def set_progress(
    task_id: str,
    from_page: int = 0,
    to_page: int = -1,
    prog: float | None = None,
    msg: str = "Processing...",
) -> None:
    """RAGFlow's signature and message formatting; records instead of updating the Task row."""
    try:
        if prog is not None and prog < 0:
            msg = "[ERROR]" + msg
        cancel = has_canceled(task_id)
        if cancel:
            msg += " [Canceled]"
            prog = -1
        if to_page > 0 and msg and from_page < to_page:
            msg = f"Page({from_page + 1}~{to_page}): " + msg
        if msg:
            msg = datetime.now().strftime("%H:%M:%S") + " " + msg
        record = {
            "task_id": task_id,
            "progress": prog,
            "progress_msg": msg,
            "consumer": CONSUMER_NAME,
            "pid": os.getpid(),
            "t": time.monotonic(),
        }
        _results_client().rpush(f"{RESULTS_KEY}:progress", json.dumps(record))
        if cancel:
            raise TaskCanceledException(msg)
        logging.info("set_progress(%s), progress: %s, progress_msg: %s", task_id, prog, msg)
    except TaskCanceledException:
        raise
    except Exception as e:
        logging.exception("set_progress(%s), progress: %s, got exception: %s", task_id, prog, e)


async def collect() -> tuple[RedisMsg | None, Task | None]:
    global UNACKED_ITERATOR, FAILED_TASKS  # noqa: PLW0603 (RAGFlow's module state)

    svr_queue_names = settings.get_svr_queue_names(TASK_TYPE)
    redis_msg = None
    try:
        if not UNACKED_ITERATOR:
            UNACKED_ITERATOR = REDIS_CONN.get_unacked_iterator(
                svr_queue_names, SVR_CONSUMER_GROUP_NAME, CONSUMER_NAME
            )
        try:
            redis_msg = next(UNACKED_ITERATOR)
        except StopIteration:
            for svr_queue_name in svr_queue_names:
                redis_msg = REDIS_CONN.queue_consumer(
                    svr_queue_name, SVR_CONSUMER_GROUP_NAME, CONSUMER_NAME
                )
                if redis_msg:
                    break
    except Exception as e:
        logging.exception("collect got exception: %s", e)
        return None, None

    if not redis_msg:
        return None, None
    msg = redis_msg.get_message()
    if not msg:
        logging.error("collect got empty message of %s", redis_msg.get_msg_id())
        redis_msg.ack()
        return None, None

    task = get_task(msg)
    canceled = bool(task) and has_canceled(str(msg["id"]))
    if not task or canceled:
        state = "is unknown" if not task else "has been cancelled"
        FAILED_TASKS += 1
        logging.warning(
            "collect task %s %s", msg.get("id") if isinstance(msg, dict) else msg, state
        )
        redis_msg.ack()
        return None, None
    task["task_type"] = msg.get("task_type", "")
    return redis_msg, task


def get_task(msg: Any) -> Task | None:
    """RAGFlow's ``TaskService.get_task``: None for an unknown task and for one delivered 3
    times already (abandoned); every delivery adds 1 to its ``retry_count``."""
    if not isinstance(msg, dict) or not msg.get("id"):
        return None
    if int(_results_client().decr(f"{RESULTS_KEY}:db_down")) >= 0:
        raise ConnectionError("(2003, \"Can't connect to MySQL server on 'mysql' ([Errno 111])\")")
    task_id = str(msg["id"])
    retry_count = int(_results_client().hincrby(f"{RESULTS_KEY}:retry_count", task_id, 1)) - 1
    if retry_count >= 3:
        record = {"task_id": task_id, "consumer": CONSUMER_NAME, "t": time.monotonic()}
        _results_client().rpush(f"{RESULTS_KEY}:abandoned", json.dumps(record))
        logging.warning("Task %s is abandoned after 3 times attempts.", task_id)
        return None
    task: Task = copy.deepcopy(msg)
    task["retry_count"] = retry_count + 1
    return task


def _fault_share(task_id: str) -> int:
    return zlib.crc32(task_id.encode()) % 100


def _msg_id(redis_msg: RedisMsg | None) -> str:
    """A Redis entry id (``ms-seq``) or a served record's ``topic:partition:offset``."""
    msg_id = redis_msg.get_msg_id() if redis_msg is not None else ""
    return msg_id.decode() if isinstance(msg_id, bytes) else str(msg_id)


async def do_handle_task(task: Task) -> None:
    """The fake workload: record the execution, sleep STANDIN_WORK_MS, maybe fail, report done."""
    msg_id = _msg_id(_current_msg.get())
    record = {
        "task_id": task["id"],
        "doc_id": task.get("doc_id"),
        "from_page": task.get("from_page"),
        "priority": task.get("priority"),
        "consumer": CONSUMER_NAME,
        "pid": os.getpid(),
        "msg_id": msg_id,
        "retry_count": task.get("retry_count"),
        "t": time.monotonic(),
    }
    _results_client().rpush(RESULTS_KEY, json.dumps(record))
    if _results_client().sismember(f"{RESULTS_KEY}:poison", task["id"]):
        logging.error("task %s kills its executor", task["id"])
        os._exit(17)
    if WORK_MS > 0:
        await asyncio.sleep(WORK_MS / 1000)
    share = _fault_share(str(task["id"]))
    # The Kafka path's fault may also start mid-run: a percentage under RESULTS_KEY:fail_kafka
    # (set by a test when its rollout reaches a step) wins over the environment's.
    live = _results_client().get(f"{RESULTS_KEY}:fail_kafka")
    fail_kafka = FAIL_KAFKA_PERCENT if live is None else float(live)
    if fail_kafka > 0 and ":" in msg_id and share < fail_kafka:
        raise InjectedFault(f"injected fault on the Kafka path for task {task['id']}")
    if FAIL_PERCENT > 0 and share < FAIL_PERCENT:
        raise InjectedFault(f"injected fault for task {task['id']}")
    set_progress(task["id"], task.get("from_page", 0), task.get("to_page", -1), 1.0, "Done")


async def handle_task() -> None:
    global DONE_TASKS, FAILED_TASKS  # noqa: PLW0603 (RAGFlow's counters)
    if stop_event.is_set():
        return
    redis_msg, task = await collect()
    if not task or redis_msg is None:
        await asyncio.sleep(IDLE_SLEEP_S)
        return
    task_id = task["id"]
    _current_msg.set(redis_msg)
    try:
        CURRENT_TASKS[task_id] = copy.deepcopy(task)
        await do_handle_task(task)
        DONE_TASKS += 1
        CURRENT_TASKS.pop(task_id, None)
        # The message id too (not in RAGFlow's line): which path and record ran it.
        logging.info("handle_task done for task %s (msg %s)", json.dumps(task), _msg_id(redis_msg))
    except TaskCanceledException as e:
        DONE_TASKS += 1
        CURRENT_TASKS.pop(task_id, None)
        logging.info("handle_task canceled for task %s: %s", task_id, e)
    except Exception as e:
        FAILED_TASKS += 1
        CURRENT_TASKS.pop(task_id, None)
        try:
            # Looked up in the module's globals at call time, as in RAGFlow: a wrapper put in
            # place of set_progress sees every failure.
            set_progress(task_id, prog=-1, msg=f"[Exception]: {e}")
        except Exception as e2:
            logging.exception("[Exception]: %s", e2)
        logging.exception("handle_task got exception for task %s", json.dumps(task))
    redis_msg.ack()


async def report_status() -> None:
    """Simplified heartbeat (see the module docstring)."""
    REDIS_CONN.REDIS.sadd("TASKEXE", CONSUMER_NAME)
    while True:
        group_info = REDIS_CONN.queue_info(settings.get_svr_queue_name(0), SVR_CONSUMER_GROUP_NAME)
        heartbeat = {
            "pid": os.getpid(),
            "name": CONSUMER_NAME,
            "now": datetime.now().astimezone().isoformat(timespec="milliseconds"),
            "boot_at": BOOT_AT,
            "pending": int((group_info or {}).get("pending", 0)),
            "lag": int((group_info or {}).get("lag") or 0),
            "done": DONE_TASKS,
            "failed": FAILED_TASKS,
            "current": copy.deepcopy(CURRENT_TASKS),
        }
        REDIS_CONN.REDIS.zadd(CONSUMER_NAME, {json.dumps(heartbeat): time.time()})
        await asyncio.sleep(HEARTBEAT_S)


def _on_signal(in_hand: set[asyncio.Task[None]]) -> None:
    logging.info("Received interrupt signal, shutting down...")
    stop_event.set()
    if STOP_MODE == "ragflow":
        asyncio.get_running_loop().call_later(1.0, lambda: [t.cancel() for t in set(in_hand)])


async def main() -> None:
    limiter = asyncio.Semaphore(MAX_CONCURRENT_TASKS)
    in_hand: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, in_hand)
    report = asyncio.create_task(report_status()) if HEARTBEAT_S > 0 else None
    logging.info(
        "consuming %s in group %s with %d slots",
        settings.get_svr_queue_names(TASK_TYPE),
        SVR_CONSUMER_GROUP_NAME,
        MAX_CONCURRENT_TASKS,
    )

    async def task_manager() -> None:
        try:
            await handle_task()
        finally:
            limiter.release()

    while True:
        await limiter.acquire()
        if stop_event.is_set():
            limiter.release()
            break
        t = asyncio.create_task(task_manager())
        in_hand.add(t)
        t.add_done_callback(in_hand.discard)
    await asyncio.gather(*in_hand, return_exceptions=True)
    if report is not None:
        report.cancel()
        await asyncio.gather(report, return_exceptions=True)
    logging.info("%s stopped: done %d, failed %d", CONSUMER_NAME, DONE_TASKS, FAILED_TASKS)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Task Executor (stand-in)")
    parser.add_argument("-i", "--index", type=str, default=None)
    parser.add_argument("-t", "--type", type=str, default="common")
    args = parser.parse_args()
    TASK_TYPE = args.type
    if args.index is not None:
        TE_IDX = args.index
    CONSUMER_NAME = os.environ.get("STANDIN_CONSUMER") or f"task_executor_{TASK_TYPE}_{TE_IDX}"
    logging.basicConfig(
        level=os.environ.get("STANDIN_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s %(levelname)s {CONSUMER_NAME} pid={os.getpid()} %(message)s",
    )
    try:
        asyncio.run(main())
    except Exception as e:
        logging.exception("Unhandled exception: %s", e)
        sys.exit(1)
