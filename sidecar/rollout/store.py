"""The autopilot's durable record in the state store, under ``SERVE_KEY_PREFIX``:

- ``rollout:state``: the current :class:`RolloutState` (JSON), written with each decision;
- ``rollout:log``: every decision (a stream, the newest 10,000 kept);
- ``rollout:counts``: decisions by action (a hash; ``/metrics`` exports it);
- ``rollout:commands``: ``pause``/``resume``/``abort`` orders waiting for the autopilot;
- ``rollout:lease``: which autopilot acts (``SET NX PX``, refreshed); the others stand by.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

import valkey.asyncio as avalkey

from sidecar.rollout.machine import COMMANDS, Command, Decision, RolloutState
from sidecar.transport.valkey_client import translate_valkey_errors

LOG_MAX: Final = 10_000

# KEYS[1]: the lease; ARGV: owner, lease ms. 1: ours (taken or kept); 0: another's.
_LEASE = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if holder then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
# KEYS[1]: the lease; ARGV[1]: owner. Let go at a clean stop, so a standby takes over at once.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class RolloutRecord:
    """The record as one read finds it; the empty record before any rollout started."""

    state: RolloutState | None = None
    counts: dict[str, int] = field(default_factory=dict)  # action -> decisions
    last: Decision | None = None  # the newest decision
    # The plan `rollout run` kept at its start (sidecar/rollout/plan.py's make_plan), if any.
    plan: dict[str, Any] | None = None


class RolloutKeys:
    def __init__(self, prefix: str) -> None:
        self.state = f"{prefix}:rollout:state"
        self.log = f"{prefix}:rollout:log"
        self.counts = f"{prefix}:rollout:counts"
        self.commands = f"{prefix}:rollout:commands"
        self.lease = f"{prefix}:rollout:lease"
        self.plan = f"{prefix}:rollout:plan"  # the forecast `rollout run` printed at its start


class RolloutStore:
    """Reads and writes the record; every Valkey error comes out as a ``SidecarError``."""

    def __init__(self, client: avalkey.Valkey, prefix: str, where: str) -> None:
        self._client = client
        self.keys = RolloutKeys(prefix)
        self._where = where
        self._lease: Any = client.register_script(_LEASE)
        self._release: Any = client.register_script(_RELEASE)

    async def load(self) -> RolloutState | None:
        with translate_valkey_errors("read the rollout's state", self._where):
            raw = await self._client.get(self.keys.state)
        return RolloutState.from_json(raw) if raw else None

    async def record(self, state: RolloutState, decision: Decision) -> None:
        """The new state and its decision, in one transaction: never one without the other."""
        with translate_valkey_errors("record a rollout decision", self._where):
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.set(self.keys.state, state.to_json())
                fields: dict[Any, Any] = decision.to_fields()
                pipe.xadd(self.keys.log, fields, maxlen=LOG_MAX, approximate=True)
                pipe.hincrby(self.keys.counts, decision.action, 1)
                await pipe.execute()

    async def save_plan(self, plan: str) -> None:
        """The forecast (JSON) ``rollout status`` shows each step's evidence against."""
        with translate_valkey_errors("keep the rollout's plan", self._where):
            await self._client.set(self.keys.plan, plan)

    async def load_plan(self) -> str | None:
        with translate_valkey_errors("read the rollout's plan", self._where):
            raw = await self._client.get(self.keys.plan)
        return _text(raw) if raw else None

    async def decisions(self, count: int) -> list[Decision]:
        """The newest ``count`` decisions, oldest first."""
        with translate_valkey_errors("read the rollout's decisions", self._where):
            entries = await self._client.xrevrange(self.keys.log, count=count)
        return [
            Decision.from_fields({_text(k): _text(v) for k, v in fields.items()})
            for _, fields in reversed(entries)
        ]

    async def counts(self) -> dict[str, int]:
        with translate_valkey_errors("read the rollout's counts", self._where):
            raw = await self._client.hgetall(self.keys.counts)  # type: ignore[misc]
        return {_text(k): int(v) for k, v in raw.items()}

    async def snapshot(self) -> RolloutRecord:
        """The state, the counts and the newest decision in one round trip (``/metrics``).
        A record that does not parse raises ``ValueError``, as a read that failed."""
        with translate_valkey_errors("read the rollout's record", self._where):
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.get(self.keys.state)
                pipe.hgetall(self.keys.counts)
                pipe.xrevrange(self.keys.log, count=1)
                pipe.get(self.keys.plan)
                raw, counts, newest, plan = await pipe.execute()
        try:
            return RolloutRecord(
                state=RolloutState.from_json(raw) if raw else None,
                counts={_text(k): int(v) for k, v in counts.items()},
                last=next(
                    (
                        Decision.from_fields({_text(k): _text(v) for k, v in fields.items()})
                        for _, fields in newest
                    ),
                    None,
                ),
                plan=json.loads(plan) if plan else None,
            )
        except (TypeError, KeyError) as exc:  # JSON of another shape, a log entry without a field
            raise ValueError(f"the rollout's record does not parse: {exc!r}") from exc

    async def order(self, command: Command) -> None:
        """Queue an operator's order for the autopilot."""
        with translate_valkey_errors(f"queue `rollout {command}`", self._where):
            await self._client.rpush(self.keys.commands, command)  # type: ignore[misc]

    async def take_orders(self) -> list[Command]:
        """The orders queued since the last call, oldest first (unknown ones dropped)."""
        with translate_valkey_errors("read rollout orders", self._where):
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.lrange(self.keys.commands, 0, -1)
                pipe.delete(self.keys.commands)
                raw, _ = await pipe.execute()
        return [order for order in map(_text, raw) if order in COMMANDS]

    async def hold_lease(self, owner: str, lease_s: float) -> bool:
        """Take or keep the lease; False while another autopilot holds it."""
        with translate_valkey_errors("hold the rollout lease", self._where):
            reply = await self._lease(keys=[self.keys.lease], args=[owner, int(lease_s * 1000)])
        return int(reply) == 1

    async def lease_holder(self) -> str | None:
        with translate_valkey_errors("read the rollout lease", self._where):
            raw = await self._client.get(self.keys.lease)
        return _text(raw) if raw else None

    async def release_lease(self, owner: str) -> None:
        with translate_valkey_errors("release the rollout lease", self._where):
            await self._release(keys=[self.keys.lease], args=[owner])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
