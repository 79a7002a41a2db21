"""``ragflow-sidecar rollout run|status|pause|resume|abort``: the autopilot and its controls."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from sidecar.app.supervisor import run_until_signal
from sidecar.config import Settings
from sidecar.rollout.autopilot import Autopilot
from sidecar.rollout.machine import Decision, RolloutState
from sidecar.rollout.store import RolloutStore
from sidecar.serve.share import STORE_WAIT_S, set_share, while_store_is_down
from sidecar.transport.valkey_client import create_client

STATUS_DECISIONS = 10


def add_parser(commands: Any) -> None:
    rollout = commands.add_parser(
        "rollout", help="the autopilot: step the served share through ROLLOUT_STEPS by the gate"
    )
    actions = rollout.add_subparsers(dest="rollout_command", required=True)
    actions.add_parser("run", help="act as the autopilot until SIGTERM (one acts at a time)")
    status = actions.add_parser("status", help="phase, step, share, and the last decisions")
    status.add_argument("--json", action="store_true", help="the status as JSON")
    actions.add_parser("pause", help="hold the share where it is until `resume`")
    actions.add_parser("resume", help="go on (from the plan's first step after a roll-back)")
    abort = actions.add_parser("abort", help="the served share to 0 now; the autopilot stops there")
    abort.add_argument(
        "--wait-s",
        type=float,
        default=STORE_WAIT_S,
        help="how long to wait for a state store that does not answer (RAGFlow serves 0 "
        "meanwhile); 0: fail at once",
    )


async def run(settings: Settings, args: argparse.Namespace) -> int:
    order = args.rollout_command
    if order == "run":
        return await run_until_signal(
            lambda: Autopilot(settings), settings.mirror.shutdown_grace_s, "rollout"
        )
    client = create_client(settings.state)
    store = RolloutStore(client, settings.serve.key_prefix, settings.state.display_url)
    try:
        if order == "status":
            print(await _status(store, as_json=args.json))
            return 0
        if order == "abort":
            # The share at once, whether an autopilot runs or not: it records the abort when it
            # next acts. Through a state-store outage RAGFlow serves 0 by itself; this waits
            # for the store (an abort queued twice is harmless).
            async def abort() -> None:
                await store.order(order)
                await set_share(settings, 0.0, by="rollout abort", reason="aborted by an operator")

            await while_store_is_down(settings, abort, args.wait_s)
            print("rollout abort: the served share is 0 now; the autopilot stops there")
        else:
            await store.order(order)
            print(f"rollout {order}: queued; the autopilot acts on it within its next turn")
        return 0
    finally:
        await client.aclose()


async def _status(store: RolloutStore, *, as_json: bool) -> str:
    state = await store.load()
    decisions = await store.decisions(STATUS_DECISIONS)
    holder = await store.lease_holder()
    if as_json:
        return json.dumps(
            {
                "state": json.loads(state.to_json()) if state else None,
                "autopilot": holder,
                "decisions": [d.to_fields() for d in decisions],
            },
            indent=2,
            sort_keys=True,
        )
    return render_status(state, decisions, holder)


def render_status(state: RolloutState | None, decisions: list[Decision], holder: str | None) -> str:
    if state is None:
        return "rollout: never started (`ragflow-sidecar rollout run` starts it)"
    lines = [
        f"rollout: {state.phase}, served share {state.share:g} %"
        + (f", step {state.step + 1}" if state.step >= 0 else ""),
        f"autopilot: {holder or 'none acting'}",
        f"this step since: {_time(state.step_since_ms)}; the rollout since: "
        f"{_time(state.started_ms)}",
        "",
        "decisions (oldest first):",
    ]
    lines += [
        f"  {_time(d.at_ms)}  {d.action:<8} {d.share_from:g} -> {d.share_to:g} %  {d.reason}"
        for d in decisions
    ]
    return "\n".join(lines)


def _time(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else "-"
