"""The rollout forecast (``rollout plan``): pure arithmetic on the margin check, so its
properties are checked directly: more documents a minute or a wider margin never take longer,
a site too slow for a week says so, and ``--within``'s margins fit the time they were fitted
to."""

from __future__ import annotations

import pytest

from sidecar.config import Settings
from sidecar.rollout.forecast import PlanSettings, SiteEvidence, fit_within, forecast
from sidecar.rollout.plan import make_plan, plan_settings, render

PLAN = plan_settings(Settings.from_env({}))


def _site(documents_per_min: float, failure_rate: float = 0.04) -> SiteEvidence:
    return SiteEvidence((documents_per_min,) * 24, failure_rate, 1.4, 2.0, 0.85, 0.85)


def _with(**margins: float) -> PlanSettings:
    return PlanSettings(
        PLAN.steps,
        PLAN.dwell_min,
        PLAN.min_documents,
        {**PLAN.margins, **margins},
        PLAN.margin_alpha,
        PLAN.holdback_percent,
    )


def test_the_shipped_plan_has_a_forecast_per_step_with_p95_after_p50() -> None:
    result = forecast(_site(5.0), PLAN)
    assert [step.share for step in result.steps] == [5.0, 25.0, 50.0, 95.0]
    hours = [step.hours_p50 for step in result.steps]
    assert hours == sorted(hours) and hours[-1] == result.hours_p50
    assert all(step.hours_p95 >= step.hours_p50 for step in result.steps)
    assert result.hours_p95 > result.hours_p50
    # The 50 % step shows the margins at 100 %: the most evidence, and Kafka's documents with it.
    assert max(result.steps, key=lambda s: s.kafka_documents).share == 50.0
    assert not result.beyond_week


def test_more_documents_a_minute_never_take_longer() -> None:
    hours = [forecast(_site(rate), PLAN) for rate in (1.0, 2.0, 5.0, 25.0, 100.0)]
    p50 = [h.hours_p50 for h in hours]
    p95 = [h.hours_p95 for h in hours]
    assert p50 == sorted(p50, reverse=True) and p95 == sorted(p95, reverse=True)
    # About inversely with the rate while the margins bind (not the dwell).
    assert 3.0 < p50[0] / p50[2] < 7.0


@pytest.mark.parametrize(
    ("name", "values"),
    [("failed", (1.0, 2.0, 4.0)), ("processing", (1.1, 1.5, 3.0)), ("queue_wait", (1.2, 3, 9))],
)
def test_a_wider_margin_never_takes_longer(name: str, values: tuple[float, ...]) -> None:
    hours = [forecast(_site(5.0), _with(**{name: v})).hours_p50 for v in values]
    assert hours == sorted(hours, reverse=True)
    assert hours[0] > hours[-1]


def test_a_site_too_slow_for_a_week_is_told_so_and_what_a_week_can_show() -> None:
    site = _site(0.2, failure_rate=0.05)
    result = forecast(site, PLAN)
    assert result.beyond_week and result.hours_p50 > 168
    planned = make_plan(site, PLAN, None, 0)
    week = planned["week_margins"]
    assert week["failed"] > PLAN.margins["failed"]  # a week shows only a wider margin
    text = render(planned, PLAN)
    assert "More than a week at this site's rate" in text
    assert "A week can show: failed" in text


def test_margins_fitted_within_a_time_fit_it() -> None:
    site = _site(5.0)
    fitted = fit_within(site, PLAN, 12.0)
    assert set(fitted) == set(PLAN.margins)
    assert fitted["failed"] > PLAN.margins["failed"]  # 12 h is less than the shipped plan takes
    assert forecast(site, _with(**fitted)).hours_p50 <= 12.0  # all three together
    # And they are the tightest that do: all a little narrower would not fit.
    tighter = {**fitted, "failed": fitted["failed"] * 0.9}
    tighter |= {n: fitted[n] ** 0.9 for n in ("processing", "queue_wait")}
    assert forecast(site, _with(**tighter)).hours_p50 > 12.0


def test_no_margin_fits_a_time_shorter_than_the_floors() -> None:
    fitted = fit_within(_site(0.5), PLAN, 0.1)  # 6 minutes: less than the 10-minute dwell
    assert all(value == float("inf") for value in fitted.values())
    assert "none within it" in render(make_plan(_site(0.5), PLAN, 0.1, 0), PLAN)


def test_a_rate_profile_that_is_not_24_hours_is_refused() -> None:
    with pytest.raises(ValueError, match="24 values"):
        forecast(SiteEvidence((5.0,) * 12, 0.04, 1.4, 2.0), PLAN)
