"""Non-inferiority (sidecar/serve/margins.py): a step is promoted on evidence that Kafka is no
worse than the margin allows at the next share, never on the silence of the harm tests."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sidecar.config.serve import GateSettings
from sidecar.serve.gate_checks import Judged, analyse
from sidecar.serve.margins import margin_at, run_margins, strata, weighed
from sidecar.wire.evidence import Evidence
from tests.test_gate_stats import minute_of

MARGINS = GateSettings().margins
EACH = 0.01 / 5
FLOOR_MS = 1000.0


def minutes(
    seed: int,
    n: int,
    share: float,
    failure: float = 0.04,
    slowdown: float = 1.0,
    drift: bool = False,
) -> list[Evidence]:
    """``n`` minutes of 100 documents, ``share`` of them on Kafka; with ``drift``, both paths'
    failure rate and times swing together hour by hour (x0.5 to x2)."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(n):
        swing = 2 ** math.sin(2 * math.pi * t / 60) if drift else 1.0
        kafka = int(rng.binomial(100, share))
        out.append(
            minute_of(
                rng,
                {"kafka": kafka, "redis": 100 - kafka},
                {"kafka": min(failure * swing, 1.0), "redis": 0.04 * swing},
                {"kafka": 20_000 * slowdown * swing, "redis": 20_000 * swing},
            )
        )
    return out


def shown(window: list[Evidence], next_share: float) -> dict[str, bool]:
    return {r.name: r.shown for r in run_margins(window, MARGINS, next_share, EACH, FLOOR_MS)}


def test_the_margin_is_the_harm_to_all_documents_at_the_next_share() -> None:
    assert margin_at("failed", 2.0, 1.0) == pytest.approx(0.02)
    assert margin_at("failed", 2.0, 0.25) == pytest.approx(0.08)
    assert math.exp(margin_at("processing", 1.2, 1.0)) == pytest.approx(1.2)
    assert math.exp(margin_at("processing", 1.2, 0.5)) == pytest.approx(1.4)


def test_the_shipped_margins_are_the_harms_the_gate_must_catch() -> None:
    assert MARGINS == {"failed": 2.0, "processing": 1.5, "queue_wait": 3.0}


def test_a_minute_weighs_what_its_difference_of_means_tells() -> None:
    """At a few documents a minute the split is uneven by chance: 3 Kafka documents beside 1
    Redis one tell a difference of means of variance s^2 (1/3 + 1), so they weigh 0.75, not
    the 3 that counting Kafka's documents gave them."""
    n_k, s_k = np.array([3.0, 2.0, 0.0]), np.array([3.0, 1.0, 0.0])
    n_r, s_r = np.array([1.0, 2.0, 4.0]), np.array([0.0, 1.0, 2.0])
    terms, weights = weighed(n_k, s_k, n_r, s_r)
    assert weights.tolist() == pytest.approx([0.75, 1.0, 0.0])
    assert terms.tolist() == pytest.approx([0.75 * (1.0 - 0.0), 1.0 * (0.5 - 0.5), 0.0])


def test_a_stratum_is_the_minutes_until_each_path_has_three_documents() -> None:
    """By the documents alone: at a few documents a minute several minutes make a stratum, at
    many a minute is one, and the minutes of the stratum still filling are left out."""
    n_k = np.array([1.0, 0.0, 2.0, 5.0, 4.0, 1.0, 0.0])
    n_r = np.array([0.0, 2.0, 1.0, 9.0, 3.0, 2.0, 5.0])
    assert strata(n_k, n_r).tolist() == [0, 0, 0, 1, 2, -1, -1]


def test_a_healthy_path_is_shown_non_inferior_once_the_evidence_is_in() -> None:
    few = minutes(1, 3, 0.02)  # about 6 Kafka documents
    assert shown(few, 1.0) == {"failed": False, "processing": False, "queue_wait": False}
    many = minutes(2, 240, 0.5, drift=True)
    assert shown(many, 1.0) == {"failed": True, "processing": True, "queue_wait": True}


@pytest.mark.parametrize("seed", range(5))
def test_two_points_more_failures_or_processing_x1_5_are_never_shown_non_inferior(
    seed: int,
) -> None:
    """However much evidence: 480 minutes at 50 %, about 24,000 Kafka documents."""
    worse = minutes(seed, 480, 0.5, failure=0.06, drift=True)
    assert not shown(worse, 1.0)["failed"]
    slower = minutes(seed, 480, 0.5, slowdown=1.5, drift=True)
    assert not shown(slower, 1.0)["processing"]
    # A small next step may take them: the margin is the harm to all documents.
    assert shown(slower, 0.05)["processing"]


def test_the_gate_holds_until_shown_and_says_how_many_documents_more() -> None:
    window = minutes(3, 30, 0.25)
    served = Evidence.from_minutes(window)
    judged = Judged()
    judged.kinds["match"] = 1000
    checks = analyse(GateSettings(), judged, served, window, served_active=True, next_share=1.0)
    rows = {c.name: c for c in checks if c.name.startswith("margin: ")}
    failed = rows["margin: failed documents"]
    assert failed.verdict == "hold" and failed.needed and failed.needed["kafka"] > 0
    assert "kafka not shown within the margin (failed documents)" in failed.reason
    assert "kafka documents more would show it" in failed.reason
    # The same evidence before a small step is enough.
    checks = analyse(GateSettings(), judged, served, window, served_active=True, next_share=0.05)
    assert all(c.verdict == "ok" for c in checks if c.name.startswith("margin: ")), [
        c.reason for c in checks if c.reason
    ]
