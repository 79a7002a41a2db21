"""Tracing overhead: mirror + shadow throughput with tracing off, at 10 % and at 100 % sampling.

One local stack (real Valkey and Kafka). Each run fills a fresh stream with ``--entries``
RAGFlow-shaped tasks of all five kinds and drains it with a whole ``Sidecar`` (mirror, redis run,
shadow consumer, judge; no observer) until every entry has its verdict: entries per second from
the sidecar's start to the last verdict, and the mirror's own rate (start to the last entry
read). Then the mirror alone (its hot path, ~14k entries/s untraced) over ``--mirror-entries``.
With tracing on, spans go over OTLP/gRPC to a real Jaeger (``make jaeger``; the local stack's,
in-memory storage), or with ``--receiver discard`` to a receiver in this process that counts and
discards them. The three modes run in turn, the order alternating between rounds; the best
rate of each is kept. Target: 10 % sampling at >= 0.9 of the untraced rate (mirror + shadow).

Usage: .venv/bin/python bench/tracing_overhead.py [--entries 20000] [--mirror-entries 100000]
       [--rounds 3] [--receiver jaeger|discard]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from bench_common import (
    alternating,
    bench_stack,
    fill,
    free_port,
    loadavg,
    mirror_rate,
    whole_sidecar_settings,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from sidecar.app.service import Sidecar
from sidecar.config import Settings
from sidecar.dev.local_stack import LocalStack
from sidecar.dev.local_stack.jaeger import JaegerPorts, LocalJaeger
from sidecar.transport.topics import init_topics

TARGET = 0.9
MODES: dict[str, dict[str, str]] = {
    "off": {},
    "10%": {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"},
    "100%": {"OTEL_TRACES_SAMPLER": "parentbased_always_on"},
}


class Discard(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    """An OTLP/gRPC trace receiver that counts spans and keeps nothing."""

    def __init__(self) -> None:
        self.spans = 0

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            for scope in resource_spans.scope_spans:
                self.spans += len(scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


def run_settings(
    stack: LocalStack, stream: str, mode: str, endpoint: str, concurrency: int
) -> Settings:
    tracing = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint, **MODES[mode]} if MODES[mode] else {}
    return whole_sidecar_settings(
        stack, stream, "bench", MAX_CONCURRENT_TASKS=str(concurrency), **tracing
    )


async def drain(settings: Settings, count: int) -> tuple[float, float]:
    """Entries per second to the last verdict, and to the mirror's last read."""
    stop = asyncio.Event()
    async with Sidecar(settings, observer=False) as sidecar:
        assert sidecar.shadow is not None and sidecar.mirror is not None
        await sidecar.shadow.wait_ready()
        started = time.perf_counter()
        loops = asyncio.create_task(sidecar.run(stop))
        mirrored_s = 0.0
        while sum(sidecar.judge.stats.verdicts.values()) < count:
            if loops.done():
                loops.result()  # a loop that died raises here
            if not mirrored_s and sidecar.mirror.stats.read >= count:
                mirrored_s = time.perf_counter() - started
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - started
        stop.set()
        await loops
        kinds = set(sidecar.judge.stats.verdicts)
        if kinds != {"match"}:
            raise SystemExit(f"unexpected verdicts {dict(sidecar.judge.stats.verdicts)}")
    return count / elapsed, count / (mirrored_s or elapsed)


def report(title: str, rates: dict[str, list[float]]) -> dict[str, float]:
    best = {mode: max(runs) for mode, runs in rates.items()}
    print(title)
    for mode in MODES:
        print(
            f"  tracing {mode:>4}: {best[mode]:8,.0f} entries/s "
            f"(ratio {best[mode] / best['off']:.2f})"
        )
    return best


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--mirror-entries", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=20, help="MAX_CONCURRENT_TASKS")
    parser.add_argument(
        "--receiver",
        choices=("jaeger", "discard"),
        default="jaeger",
        help="where spans go: a real Jaeger, or a receiver here that counts and drops them",
    )
    args = parser.parse_args()

    receiver = Discard()  # counts only with --receiver discard: Jaeger's count is not read
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    endpoint = f"http://127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    root = Path(tempfile.mkdtemp(prefix="sidecar-bench-"))
    stack = bench_stack(root)
    stack.up()
    jaeger = None
    if args.receiver == "jaeger":
        ports = (free_port() for _ in range(5))
        jaeger = LocalJaeger(root / "jaeger", JaegerPorts(*ports))
        jaeger.start()
        endpoint = jaeger.otlp_grpc_endpoint
        print(f"spans to Jaeger at {endpoint} (query API {jaeger.query_url})", flush=True)

    def exported(spans: int) -> str:
        return "spans to Jaeger" if jaeger else f"{spans:7,} spans exported"

    try:
        await init_topics(run_settings(stack, "unused", "off", endpoint, 1).kafka)
        rates: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
        # A warm-up run, not counted: topic metadata, first connections, imports.
        fill(stack.valkey.url, "bench.trace.warmup", 2000)
        await drain(run_settings(stack, "bench.trace.warmup", "100%", endpoint, 20), 2000)
        for round_no, mode in alternating(args.rounds, list(MODES)):
            stream = f"bench.trace.{round_no}.{mode.strip('%')}"
            fill(stack.valkey.url, stream, args.entries)
            spans_before = receiver.spans
            settings = run_settings(stack, stream, mode, endpoint, args.concurrency)
            verdict_rate, mirrored_rate = await drain(settings, args.entries)
            rates[mode].append((verdict_rate, mirrored_rate))
            print(
                f"round {round_no + 1} tracing {mode:>4}: {verdict_rate:8,.0f} entries/s "
                f"to verdicts, mirror {mirrored_rate:8,.0f}/s, "
                f"{exported(receiver.spans - spans_before)} (load {loadavg()})",
                flush=True,
            )
        alone: dict[str, list[float]] = {mode: [] for mode in MODES}
        for round_no, mode in alternating(args.rounds, list(MODES)):
            stream = f"bench.trace.mirror.{round_no}.{mode.strip('%')}"
            fill(stack.valkey.url, stream, args.mirror_entries)
            spans_before = receiver.spans
            rate = await mirror_rate(
                run_settings(stack, stream, mode, endpoint, 1), args.mirror_entries
            )
            alone[mode].append(rate)
            print(
                f"round {round_no + 1} mirror alone, tracing {mode:>4}: {rate:8,.0f} entries/s,"
                f" {exported(receiver.spans - spans_before)} (load {loadavg()})",
                flush=True,
            )
        best = report(
            f"best of {args.rounds}, {args.entries:,} entries, mirror + shadow + verdicts:",
            {mode: [r[0] for r in runs] for mode, runs in rates.items()},
        )
        report(
            "  (the mirror's rate within those runs)",
            {m: [r[1] for r in v] for m, v in rates.items()},
        )
        report(f"best of {args.rounds}, {args.mirror_entries:,} entries, the mirror alone:", alone)
        met = best["10%"] / best["off"] >= TARGET
        print(f"  target: 10 % sampling >= {TARGET} of untraced: {'met' if met else 'NOT met'}")
        return 0 if met else 1
    finally:
        if jaeger is not None:
            jaeger.stop()
        stack.down()
        shutil.rmtree(root, ignore_errors=True)
        await server.stop(None)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
