"""The live share: the served share as set in the state store, followed without a restart.

``ragflow-sidecar shift --to P`` writes it (``gate --apply`` writes 0 on a roll-back); every
RAGFlow process with ``install()`` reads it every ``SERVE_SHARE_REFRESH_S`` and serves
``min(KAFKA_SERVE_PERCENT, live share)``: the env stays the operator's ceiling, which nothing in
the store can exceed. A live share never set serves the ceiling, as before there was one.

A process that cannot read the share serves 0, never the ceiling: from its start until its
first read answers, and through a state-store outage until the store has answered again for
``RECOVERED_HOLD_S`` (the time a roll-back written when the store returns, by a ``shift --to 0``
that waited through the outage, takes to land before anything is served again). New tasks go
to Redis meanwhile, RAGFlow's own path, which needs no state store (docs/operations.md, "A
state-store outage").

The cap of earlier builds (``<prefix>:serve_cap``) is still honoured, the lower of the two
winning, so a roll-back written by an older gate holds through the upgrade; the next shift
folds it in (writes 100, its no-cap value).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sidecar.wire.contract import Keys
from sidecar.wire.share import ShareValues, parse_percent, share_keys

logger = logging.getLogger(__name__)

RECOVERED_HOLD_S = 10.0


class LiveShare:
    """One RAGFlow process's view of the live share, read from the state store.

    A key that vanishes after it was read keeps its last value: ``shift`` never deletes one,
    so a vanished key was evicted (RAGFlow's Valkey is an LRU cache), and an eviction must not
    raise the share by itself. A process started after the eviction serves the ceiling.
    """

    def __init__(self, keys: Keys) -> None:
        self._keys = keys
        self.values = ShareValues()
        self._read_failed = False
        self._readable = False  # no read has answered yet: serve 0
        self._outage_at: float | None = None  # time.monotonic() of this outage's first failure
        self._hold_until = 0.0  # time.monotonic(): serve 0 until then, after an outage
        self.tried = threading.Event()  # set once a first read has answered or failed
        self._vanished: set[str] = set()
        self._garbled: set[str] = set()

    def served(self, ceiling: float) -> float:
        """What RAGFlow serves now: 0 while the share cannot be read (or was not yet, or the
        store has just come back), else the ceiling lowered by the live share and the cap."""
        if not self._readable or time.monotonic() < self._hold_until:
            return 0.0
        return self.values.served(ceiling)

    def read(self, client: Any) -> None:
        """Both keys in one round trip (a pipeline of GETs: the ACL of docs/security.md);
        a failed read serves 0 until the store answers again, with one warning per outage."""
        try:
            pipe = client.pipeline(transaction=False)
            for key in share_keys(self._keys):
                pipe.get(key)
            live_raw, cap_raw = pipe.execute()
        except Exception as exc:
            self.tried.set()
            self._readable = False
            if not self._read_failed:
                self._read_failed = True
                self._outage_at = time.monotonic()
                logger.warning(
                    "ragflow_mq cannot read the live share: new tasks go to Redis until the "
                    "state store answers (once per outage): %s",
                    exc,
                )
            return
        values = ShareValues(
            self._value(self._keys.share, live_raw, self.values.live),
            self._value(self._keys.old_cap, cap_raw, self.values.old_cap),
        )
        if values != self.values:
            logger.info("ragflow_mq: live share now %s, old cap %s", values.live, values.old_cap)
        # The values, then the hold, then readable: a caller in another thread never sees a
        # readable share with the values from before this read.
        self.values = values
        if self._read_failed:
            self._read_failed = False
            self._hold_until = time.monotonic() + RECOVERED_HOLD_S
            lasted_s = time.monotonic() - (self._outage_at or time.monotonic())
            logger.warning(
                "ragflow_mq reads the live share again after %.0f s; serving it in %.0f s",
                lasted_s,
                RECOVERED_HOLD_S,
            )
        self._readable = True
        self.tried.set()

    def _value(self, key: str, raw: str | bytes | None, last: float | None) -> float | None:
        if raw is None and last is not None:
            if key not in self._vanished:
                self._vanished.add(key)
                logger.warning(
                    "ragflow_mq: %s vanished (evicted?); keeping %g until it is set", key, last
                )
            return last
        self._vanished.discard(key)
        value = parse_percent(raw)
        if raw is not None and value is None:
            if key not in self._garbled:
                self._garbled.add(key)
                logger.warning("ragflow_mq: %s holds %r, not a number; ignored", key, raw)
        else:
            self._garbled.discard(key)
        return value
