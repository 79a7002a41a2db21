"""The autopilot shifting RAGFlow's execution to Kafka on a local stack of its own.

Two RAGFlow stand-in executors and the stand-in API load ``ragflow_mq.install()``
(MQ_BACKEND=split, the ceiling KAFKA_SERVE_PERCENT=100, the live share 0 to begin with), the
whole sidecar judges the Redis path, and ``ragflow-sidecar rollout run`` steps the live share
through a plan scaled down to seconds (``tests/rollout_support.py``):

1. a clean shift: the autopilot climbs 10 -> 50 -> 100 % by the gate and watches there;
2. the same with 5 % of the Kafka path's tasks failing: it rolls back to 0 by itself.

Each run prints its decisions, and one row: tasks, executed via Redis and via Kafka, lost,
doubled. Exit 0 when the clean run reached 100 %, the failing one rolled back, and no task
was lost or doubled; 1 otherwise; 2 when run outside a checkout (the stand-in is in tests/).

Run from a checkout: ``python tools/shift_demo.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
KAFKA_FAILURES = 5  # percent of the Kafka path's tasks failing in the second run


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def render(title: str, run: Any) -> str:
    lines = [title]
    for decision in run.decisions:
        if decision["action"] == "hold":
            continue
        at = time.strftime("%H:%M:%S", time.localtime(int(decision["at_ms"]) / 1000))
        lines.append(
            f"  {at}  {decision['action']:<8} {decision['share_from']:>3} -> "
            f"{decision['share_to']:>3} %  {decision['reason'][:110]}"
        )
    holds = sum(1 for d in run.decisions if d["action"] == "hold")
    kafka = sum(1 for r in run.records if ":" in str(r["msg_id"]))
    lines.append(
        f"  ended {run.state.phase} at {run.state.share:g} % after {run.seconds:.0f} s "
        f"({holds} holds); {len(run.task_ids)} tasks: redis {len(run.records) - kafka}, "
        f"kafka {kafka}, lost {run.lost}, doubled {run.doubled}, unexpected {run.unexpected}"
    )
    return "\n".join(lines)


async def run(root: Path) -> bool:
    # Imported here: they need the checkout's tests/ on sys.path (see main).
    import valkey.asyncio as avalkey  # noqa: PLC0415

    from sidecar.dev.local_stack import LocalStack, StackConfig  # noqa: PLC0415
    from tests.rollout_support import run_rollout  # noqa: PLC0415
    from tests.serve_support import make_world  # noqa: PLC0415

    stack = LocalStack(
        StackConfig(
            root=root / "stack",
            valkey_port=free_port(),
            kafka_port=free_port(),
            kafka_controller_port=free_port(),
        )
    )
    try:
        print("starting a local stack (Valkey and Kafka) on free ports ...", flush=True)
        stack.up()
        client = avalkey.Valkey.from_url(stack.valkey.url)
        try:
            results = []
            for failures, until in ((0, ("watching",)), (KAFKA_FAILURES, ("rolled_back",))):
                unique = f"shift{uuid.uuid4().hex[:8]}"
                world = await make_world(
                    stack, unique, root, KAFKA_SERVE_PERCENT="100", SERVE_SHARE_REFRESH_S="0.5"
                )
                print(f"rollout with {failures} % of Kafka tasks failing ...", flush=True)
                outcome = await run_rollout(
                    world, client, until=until,
                    executor_env={"STANDIN_FAIL_KAFKA_PERCENT": str(failures)},
                )  # fmt: skip
                title = f"the autopilot, {failures} % of the Kafka path's tasks failing:"
                print(render(title, outcome), flush=True)
                results.append(outcome)
        finally:
            await client.aclose()
    finally:
        stack.down()
    clean, failing = results
    return (
        clean.state is not None
        and (clean.state.phase, clean.live) == ("watching", 100.0)
        and failing.state is not None
        and (failing.state.phase, failing.live) == ("rolled_back", 0.0)
        and all(r.lost == 0 and r.doubled == 0 and r.unexpected == 0 for r in results)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    if not (REPO / "tests" / "ragflow_standin").is_dir():
        print(
            "the shift demo needs a checkout of ragflow-kafka-sidecar: it drives the RAGFlow "
            f"stand-in in tests/ragflow_standin, which is missing under {REPO}",
            file=sys.stderr,
        )
        return 2
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    root = Path(tempfile.mkdtemp(prefix="shift-demo-"))
    try:
        ok = asyncio.run(run(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print(
        "the autopilot climbed a clean shift to 100 % and rolled a failing one back to 0 by "
        "itself; every task executed exactly once"
        if ok
        else "the autopilot did not do what was expected, or tasks were lost or doubled"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
