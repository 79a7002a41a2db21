"""Profile the sidecar's hot paths with pyinstrument, on a local stack of its own.

1. The mirror alone draining ``--mirror-entries`` RAGFlow-shaped tasks (its per-task path:
   decode, route, headers, produce, ack), as ``bench/mirror_throughput.py`` runs it.
2. The whole sidecar (mirror, redis run, shadow consumer, judge; no observer) draining
   ``--entries`` tasks to their verdicts, as ``bench/tracing_overhead.py`` runs it.

Each profile is printed as pyinstrument's text tree (frames under ``--min-percent`` of the
time hidden) with the rate of that run; profiling slows the run, so the rates here are not
the benchmark's. ``--html DIR`` also writes the interactive pages.

Usage: .venv/bin/python bench/profile_hot_path.py [--mirror-entries 100000] [--entries 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from bench_common import bench_stack, fill, loadavg, mirror_rate, whole_sidecar_settings
from pyinstrument import Profiler

from sidecar.app.service import Sidecar
from sidecar.config import Settings
from sidecar.transport.topics import init_topics


async def whole_sidecar(settings: Settings, count: int, profiler: Profiler) -> float:
    stop = asyncio.Event()
    async with Sidecar(settings, observer=False) as sidecar:
        assert sidecar.shadow is not None
        await sidecar.shadow.wait_ready()
        profiler.start()
        started = time.perf_counter()
        loops = asyncio.create_task(sidecar.run(stop))
        while sum(sidecar.judge.stats.verdicts.values()) < count:
            if loops.done():
                loops.result()
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - started
        profiler.stop()
        stop.set()
        await loops
    return count / elapsed


def show(title: str, profiler: Profiler, min_percent: float, html: Path | None) -> None:
    print(f"\n=== {title} ===")
    print(
        profiler.output_text(
            unicode=True, color=False, show_all=False, time="percent_of_total",
            processor_options={"filter_threshold": min_percent / 100},
        )
    )  # fmt: skip
    if html is not None:
        html.mkdir(parents=True, exist_ok=True)
        page = html / f"{title.split(':', maxsplit=1)[0].replace(' ', '_')}.html"
        page.write_text(profiler.output_html())
        print(f"(interactive: {page})")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mirror-entries", type=int, default=100_000)
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--min-percent", type=float, default=2.0)
    parser.add_argument("--only", choices=("mirror", "sidecar"))
    parser.add_argument("--html", type=Path)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="sidecar-profile-"))
    stack = bench_stack(root)
    stack.up()
    try:
        await init_topics(whole_sidecar_settings(stack, "unused", "profile").kafka)
        runs = [
            ("mirror", "mirror alone", args.mirror_entries, "entries", mirror_rate),
            ("sidecar", "whole sidecar", args.entries, "entries to verdicts", whole_sidecar),
        ]
        for name, title, count, what, measure in runs:
            if args.only not in (None, name):
                continue
            stream = f"profile.{name}"
            fill(stack.valkey.url, stream, count)
            profiler = Profiler(interval=0.001, async_mode="disabled")
            settings = whole_sidecar_settings(stack, stream, "profile", MAX_CONCURRENT_TASKS="20")
            rate = await measure(settings, count, profiler)
            show(f"{title}: {count:,} {what}, {rate:,.0f}/s under the profiler, load average "
                 f"{loadavg()}", profiler, args.min_percent, args.html)  # fmt: skip
    finally:
        stack.down()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
