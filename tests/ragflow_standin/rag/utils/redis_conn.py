"""Stand-in of RAGFlow's ``rag/utils/redis_conn.py``: the task-queue half of ``RedisDB``.

Written by us to behave as RAGFlow's does (same names, synchronous signatures, return values,
retries and logging), on ``valkey`` with ``decode_responses=True``. The connection comes from env
``REDIS_URL`` (default ``redis://localhost:6379/1``) instead of ``service_conf.yaml``.
``ragflow_mq.install()`` patches ``queue_product``, ``queue_consumer``, ``get_unacked_iterator``
and ``queue_info`` on ``REDIS_CONN`` in place, so they are looked up on the instance.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import Any, cast

import valkey as redis
from common.decorator import singleton

__all__ = ["REDIS_CONN", "RedisDB", "RedisMsg", "standin_redis_url"]

MsgId = str | bytes | int


class RedisMsg:
    """One stream entry handed to a consumer; ``message`` is the entry's field map."""

    def __init__(
        self,
        consumer: redis.StrictRedis,
        queue_name: str,
        group_name: str,
        msg_id: MsgId,
        message: dict[str, Any],
    ) -> None:
        self.__consumer = consumer
        self.__queue_name = queue_name
        self.__group_name = group_name
        self.__msg_id = msg_id
        self.__message = json.loads(message["message"])

    def ack(self) -> bool:
        try:
            self.__consumer.xack(self.__queue_name, self.__group_name, self.__msg_id)
            return True
        except Exception as e:
            logging.warning("[EXCEPTION]ack%s||%s", self.__queue_name, e)
        return False

    def get_message(self) -> Any:
        return self.__message

    def get_msg_id(self) -> MsgId:
        return self.__msg_id


def standin_redis_url() -> str:
    """Env ``REDIS_URL`` (the stand-in's replacement for service_conf.yaml's ``redis:``)."""
    url = os.environ.get("REDIS_URL") or "redis://localhost:6379/1"
    # valkey-py knows redis:// and rediss://; the sidecar also accepts valkey:// and valkeys://.
    if url.startswith("valkey://"):
        url = "redis://" + url.removeprefix("valkey://")
    elif url.startswith("valkeys://"):
        url = "rediss://" + url.removeprefix("valkeys://")
    return url


@singleton
class RedisDB:
    def __init__(self) -> None:
        self.REDIS: redis.StrictRedis = self.__open__()

    def __open__(self) -> redis.StrictRedis:
        try:
            self.REDIS = redis.StrictRedis.from_url(standin_redis_url(), decode_responses=True)
        except Exception as e:
            logging.warning("Redis can't be connected. Error: %s", e)
        return self.REDIS

    def _groups(self, queue: str) -> list[dict[str, Any]]:
        """XINFO GROUPS (typed: the sync client's stubs say "awaitable or anything")."""
        return cast(list[dict[str, Any]], self.REDIS.xinfo_groups(queue))

    def health(self) -> bool:
        return bool(self.REDIS.ping())

    def get(self, k: str) -> Any:
        try:
            return self.REDIS.get(k)
        except Exception as e:
            logging.warning("RedisDB.get %s got exception: %s", k, e)
            self.__open__()
        return None

    def set(self, k: str, v: Any, exp: int = 3600) -> bool:
        try:
            self.REDIS.set(k, v, exp)
            return True
        except Exception as e:
            logging.warning("RedisDB.set %s got exception: %s", k, e)
            self.__open__()
        return False

    def queue_product(self, queue: str, message: Any) -> bool:
        for _ in range(3):
            try:
                payload = {"message": json.dumps(message)}
                self.REDIS.xadd(queue, payload)
                return True
            except Exception as e:
                logging.exception("RedisDB.queue_product %s got exception: %s", queue, e)
                self.__open__()
        return False

    def queue_consumer(
        self, queue_name: str, group_name: str, consumer_name: str, msg_id: MsgId = b">"
    ) -> RedisMsg | None:
        """XREADGROUP COUNT 1 BLOCK 5; creates the group at id 0 (MKSTREAM) when it is missing."""
        for _ in range(3):
            try:
                try:
                    group_info = self._groups(queue_name)
                    if not any(gi["name"] == group_name for gi in group_info):
                        self.REDIS.xgroup_create(queue_name, group_name, id="0", mkstream=True)
                except redis.exceptions.ResponseError as e:
                    if "no such key" in str(e).lower():
                        self.REDIS.xgroup_create(queue_name, group_name, id="0", mkstream=True)
                    elif "busygroup" in str(e).lower():
                        logging.warning("Group already exists, continue.")
                    else:
                        raise
                messages: Any = self.REDIS.xreadgroup(
                    groupname=group_name,
                    consumername=consumer_name,
                    count=1,
                    block=5,
                    streams={queue_name: cast(Any, msg_id)},
                )
                if not messages:
                    return None
                _stream, element_list = messages[0]
                if not element_list:
                    return None
                entry_id, payload = element_list[0]
                return RedisMsg(self.REDIS, queue_name, group_name, entry_id, payload)
            except Exception as e:
                if str(e) == "no such key":
                    pass
                else:
                    logging.exception("RedisDB.queue_consumer %s got exception: %s", queue_name, e)
                    self.__open__()
        return None

    def get_unacked_iterator(
        self, queue_names: list[str], group_name: str, consumer_name: str
    ) -> Iterator[RedisMsg]:
        """Replay this consumer's own pending entries, stream by stream, in id order.

        Reads with an explicit id (0, then the last id seen), which XREADGROUP answers from the
        consumer's pending list only; streams or groups that do not exist are skipped.
        """
        try:
            for queue_name in queue_names:
                try:
                    group_info = self._groups(queue_name)
                except Exception as e:
                    if str(e) == "no such key":
                        logging.warning(
                            "RedisDB.get_unacked_iterator queue %s doesn't exist", queue_name
                        )
                        continue
                    raise
                if not any(gi["name"] == group_name for gi in group_info):
                    logging.warning(
                        "RedisDB.get_unacked_iterator queue %s group %s doesn't exist",
                        queue_name,
                        group_name,
                    )
                    continue
                current_min: MsgId = 0
                while True:
                    payload = self.queue_consumer(
                        queue_name, group_name, consumer_name, current_min
                    )
                    if not payload:
                        break
                    current_min = payload.get_msg_id()
                    logging.info(
                        "RedisDB.get_unacked_iterator %s %s %s",
                        queue_name,
                        consumer_name,
                        current_min,
                    )
                    yield payload
        except Exception:
            logging.exception("RedisDB.get_unacked_iterator got exception: ")
            self.__open__()

    def get_pending_msg(self, queue: str, group_name: str) -> list[dict[str, Any]]:
        try:
            return cast(
                list[dict[str, Any]], self.REDIS.xpending_range(queue, group_name, "-", "+", 10)
            )
        except Exception as e:
            if "No such key" not in (str(e) or ""):
                logging.warning("RedisDB.get_pending_msg %s got exception: %s", queue, e)
        return []

    def queue_info(self, queue: str, group_name: str) -> dict[str, Any] | None:
        """The group's XINFO GROUPS entry (name, consumers, pending, last-delivered-id, lag...)."""
        for _ in range(3):
            try:
                groups = self._groups(queue)
                for group in groups:
                    if group["name"] == group_name:
                        return dict(group)
            except Exception as e:
                logging.warning("RedisDB.queue_info %s got exception: %s", queue, e)
                self.__open__()
        return None


REDIS_CONN = RedisDB()
