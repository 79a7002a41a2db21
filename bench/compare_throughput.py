"""Comparator throughput: verdicts per second on matching and on mismatching task pairs.

A verdict on one task takes what the shadow consumer needs for its record: the payload
comparison (the bytes RAGFlow put on the Redis stream against the Kafka copy), the outcome
comparison under the task type's rules, and the digest of both outcomes. Outcomes are
derived from RAGFlow-shaped tasks (``sidecar.dev.samples.ragflow_tasks``), each side decoding
its own copy of the payload, as the two paths do.

- Matching pairs take the fast path: equal bytes, then equal canonical JSON, each side
  serialised once and its digest taken from those bytes (``compare_with_digests``).
- Mismatching pairs have one field changed and go through deepdiff.
- For scale, the matching pairs are also run the naive way (``compare`` then
  ``outcome_digest`` of each side: canonical JSON twice per side).

Both are measured in one run, best of ``--repeat``, so their ratio is meaningful.
Target: at least 10,000 verdicts/s on matching pairs; the exit status is 1 if missed.

Usage: .venv/bin/python bench/compare_throughput.py [--n 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from comparators import (
    CompareRules,
    OutcomeComparator,
    PayloadComparator,
    TypeRules,
    outcome_digest,
)
from sidecar.dev.samples import ragflow_tasks

TARGET = 10_000.0

# What a deployment would plausibly configure: bookkeeping times and progress text vary.
RULES = CompareRules(
    TypeRules(
        exclude_paths=("task.progress_msg",),
        exclude_regex_paths=(r"(^|\.)(create|update)_(time|date)$",),
    )
)

Pair = tuple[bytes, bytes, dict[str, Any], dict[str, Any], str]


def task_type(task: dict[str, Any]) -> str:
    # RAGFlow's parse tasks carry no task_type key.
    return str(task.get("task_type", "parse"))


def derive_outcome(task: dict[str, Any]) -> dict[str, Any]:
    """What a consumer would record for ``task``; the user text of memory tasks stays out."""
    fields = {key: value for key, value in task.items() if key != "message_dict"}
    if "message_dict" in task:
        fields["message_chars"] = len(task["message_dict"].get("user_input", ""))
    return {
        "kind": task_type(task),
        "decision": "process",
        "task": fields,
        "pages": [task.get("from_page", 0), task.get("to_page", 0)],
    }


def change_one_field(outcome: dict[str, Any], i: int) -> dict[str, Any]:
    """A copy of ``outcome`` with one field (of several kinds, in turn) changed."""
    changed: dict[str, Any] = json.loads(json.dumps(outcome))
    match i % 4:
        case 0:
            changed["pages"][1] += 1
        case 1:
            changed["decision"] = "skip"
        case 2:
            changed["task"]["id"] = "0" * 32
        case _:
            changed["task"]["retry_count"] = 1
    return changed


def build_pairs(n: int) -> tuple[list[Pair], list[Pair]]:
    matching: list[Pair] = []
    mismatching: list[Pair] = []
    for i, task in enumerate(ragflow_tasks(n)):
        redis_bytes = json.dumps(task).encode()  # as RAGFlow's queue_product writes it
        kafka_bytes = bytes(bytearray(redis_bytes))  # a copy, not the same object
        left = derive_outcome(json.loads(redis_bytes))
        right = derive_outcome(json.loads(kafka_bytes))
        kind = task_type(task)
        matching.append((redis_bytes, kafka_bytes, left, right, kind))
        mismatching.append((redis_bytes, kafka_bytes, left, change_one_field(right, i), kind))
    return matching, mismatching


def verdicts_fast(pairs: list[Pair]) -> int:
    """Verdicts as the shadow consumer takes them; returns how many were matches."""
    payload, outcome = PayloadComparator(), OutcomeComparator(RULES)
    matches = 0
    for redis_bytes, kafka_bytes, left, right, kind in pairs:
        payload_differences = payload.compare(redis_bytes, kafka_bytes)
        result = outcome.compare_with_digests(left, right, kind)
        if not payload_differences and result.equal:
            matches += 1
    return matches


def verdicts_naive(pairs: list[Pair]) -> int:
    """The same verdicts with each side's canonical JSON computed twice."""
    payload, outcome = PayloadComparator(), OutcomeComparator(RULES)
    matches = 0
    for redis_bytes, kafka_bytes, left, right, kind in pairs:
        payload_differences = payload.compare(redis_bytes, kafka_bytes)
        differences = outcome.compare(left, right, kind)
        outcome_digest(left)
        outcome_digest(right)
        if not payload_differences and not differences:
            matches += 1
    return matches


def best_rate(
    run: Callable[[list[Pair]], int], pairs: list[Pair], repeat: int
) -> tuple[float, int]:
    best = 0.0
    matches = 0
    for _ in range(repeat):
        start = time.perf_counter()
        matches = run(pairs)
        best = max(best, len(pairs) / (time.perf_counter() - start))
    return best, matches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=20_000, help="pairs of each sort (20000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, best kept (3)")
    args = parser.parse_args()

    matching, mismatching = build_pairs(args.n)
    match_rate, matched = best_rate(verdicts_fast, matching, args.repeat)
    naive_rate, naive_matched = best_rate(verdicts_naive, matching, args.repeat)
    mismatch_rate, mismatched_matches = best_rate(verdicts_fast, mismatching, args.repeat)
    # A fast wrong answer is no result.
    if matched != args.n or naive_matched != args.n or mismatched_matches != 0:
        print(f"wrong verdicts: {matched}, {naive_matched} of {args.n} matches, "
              f"{mismatched_matches} false matches")  # fmt: skip
        return 2

    met = match_rate >= TARGET
    print(f"comparator throughput, {args.n:,} pairs of each sort, best of {args.repeat}")
    print(f"  matching pairs, fast path:       {match_rate:>10,.0f} verdicts/s "
          f"({1e6 / match_rate:6.1f} µs each)")  # fmt: skip
    print(f"  matching pairs, naive (2x JSON): {naive_rate:>10,.0f} verdicts/s "
          f"({1e6 / naive_rate:6.1f} µs each)")  # fmt: skip
    print(f"  mismatching pairs, deepdiff:     {mismatch_rate:>10,.0f} verdicts/s "
          f"({1e6 / mismatch_rate:6.1f} µs each)")  # fmt: skip
    print(f"  ratio matching/mismatching:      {match_rate / mismatch_rate:>10.1f}x")
    print(f"  target >= {TARGET:,.0f} verdicts/s on matches: {'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
