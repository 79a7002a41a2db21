"""Names renamed by the glossary (issue 11) stay readable for one release (docs/metrics.md)."""

from __future__ import annotations

import json

from sidecar.app.metrics_catalog import _with_renamed
from sidecar.cli.status import _counts
from sidecar.verdicts.model import VerdictRecord, canonical_verdict, parse_verdict


def test_a_record_of_the_previous_release_reads_in_the_new_names() -> None:
    old = {
        "verdict": "missing_primary",
        "control_digest": "c",
        "candidate_digest": "k",
        "verdict_id": "s/1-0/final",
    }
    body = parse_verdict(json.dumps(old).encode())
    assert body["verdict"] == "missing_in_redis"
    assert (body["redis_run_digest"], body["kafka_run_digest"]) == ("c", "k")
    assert canonical_verdict("missing_primary") == "missing_in_redis"
    assert canonical_verdict("match") == "match"


def test_a_new_record_still_carries_the_old_keys() -> None:
    record = VerdictRecord(
        "match", "s", "1-0", "t", "parse", 0, "me", redis_run_digest="r", kafka_run_digest="k",
        timings={"redis_run": {"processing_ms": 3}, "kafka": {"processing_ms": 4}},
    )  # fmt: skip
    body = record.to_dict()
    assert (body["redis_run_digest"], body["control_digest"]) == ("r", "r")
    assert (body["kafka_run_digest"], body["candidate_digest"]) == ("k", "k")
    assert body["timings"]["control"] == body["timings"]["redis_run"] == {"processing_ms": 3}
    assert parse_verdict(record.to_json())["verdict"] == "match"


def test_status_adds_an_old_count_to_the_new_name() -> None:
    counts = _counts({b"missing_primary": b"2", b"missing_in_redis": b"3", b"match": b"7"})
    assert counts["missing_in_redis"] == 5 and counts["match"] == 7
    assert "missing_primary" not in counts


def test_the_verdicts_metric_keeps_the_old_name_beside_the_new() -> None:
    series = _with_renamed(
        [
            ({"verdict": "missing_in_redis", "task_type": "parse"}, 4.0),
            ({"verdict": "match", "task_type": "parse"}, 9.0),
        ]
    )
    assert ({"verdict": "missing_primary", "task_type": "parse"}, 4.0) in series
    assert ({"verdict": "missing_in_redis", "task_type": "parse"}, 4.0) in series
    assert len(series) == 3
