"""The bound (issue 36): the documents a fixed-horizon test needs to show each step's margins,
beside the documents the gate needs.

Per step below 100 % (its share s, the next one s'), per margin: a one-sided two-sample
non-inferiority z-test with known variance, at the gate's GATE_MARGIN_ALPHA and a power, of
Kafka's excess over Redis against the margin allowed at the next share (margin_at: margin/s'),
the documents split s : 1 - s as the step splits them. Its difference of means has variance
sigma^2 / (N s (1 - s)) over N documents, so it needs

    N = (z_alpha + z_power)^2 sigma^2 / (delta^2 s (1 - s))

documents (both paths), where ``N s (1 - s)`` is the gate's effective documents W. A step needs
the most any of its margins needs; the last step (100 %, 95 % served) shows no margin, so the
bound is none there (the gate spends its dwell and ROLLOUT_MIN_DOCUMENTS on it). Each step is
priced fresh (``bound``, issue 36's per-step bound: the target is judged on it) and with the
evidence of the steps before it carried (``carried``: the gate's window starts with the
rollout, so it carries it too; the lesser, and the stricter comparison).

sigma^2 is one document's variance in the gate's units (a failed document 0/1; ln of the
histogram bucket's typical time, the buckets under the latency floor merged), taken from the
population simulate draws (gate_populations.RolloutPopulation), three ways:

- ``pooled``: over all minutes, drift and batches included: what the gate's bound takes as its
  variance (it pools the window);
- ``within``: the drift and batches taken out (minute-by-minute comparison, as the gate's
  strata do): the bound's variance, the least a like-for-like comparison faces;
- ``covariate``: also the task count's part taken out (CUPED on a document's task count): what
  a gate regressing on it could reach. Not the bound the target is against: shown as headroom.

The gate's documents per step are simulate's A/A runs (bench/gate_defaults.py): Kafka's and
Redis's documents when the step was promoted. Power 50 % is compared with the gate's p50 and
95 % with its p95, per step and overall (documents to 100 %, which includes the last step's).
Issue 36's target: the gate's documents to 100 % within 2x of the bound, overall. Last, the
price of anytime validity on its own (``premium``): the same bound watched every moment on
Brownian A/A sums, at several rho.

    .venv/bin/python bench/gate_bound.py [--documents-per-min 5,25] [--runs 60] [--seed 3602]
       [--population held-out]
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
from bench_common import loadavg
from gate_populations import FLOOR_MS, HELD_OUT, ROLLOUT_POPULATIONS, RolloutPopulation
from gate_simulate import Defaults, Scenario, simulate
from scipy.stats import norm

from sidecar.serve import histograms as hist
from sidecar.serve.gate_tests import MARGIN_TESTS
from sidecar.serve.margins import RHO_FRACTION, margin_at, mixture_radius, rho_for
from sidecar.serve.sequential import Array
from sidecar.wire.contract import BUCKETS_MS

RATES = (1.0, 5.0, 25.0, 100.0)  # documents a minute the hours are shown at
DRAWS = 400_000  # documents drawn for each variance
TARGET_RATIO = 2.0


def _scores(times_ms: Array) -> Array:
    """Each time's score as the gate reads it: ln of its bucket's typical time, the buckets
    under the floor merged (sidecar/serve/histograms)."""
    bounds = tuple(BUCKETS_MS)
    merged, _ = hist.merge_floor(bounds, np.zeros((1, len(bounds) + 1)), FLOOR_MS)
    below = hist.below_floor(bounds, FLOOR_MS)
    index = np.searchsorted(np.array(bounds), times_ms, side="left")
    if below > 1:
        index = np.maximum(index - below + 1, 0)
    return np.asarray(hist.scores(merged)[index])


def variances(rng: np.random.Generator, pop: RolloutPopulation) -> dict[str, dict[str, float]]:
    """Per margin, one document's variance: pooled, within a minute, and with the task count
    also taken out (see the module's docstring)."""
    sizes_of, size_p = pop.sizes
    sizes = rng.choice(sizes_of, DRAWS, p=size_p)
    mean_log, _ = pop.log_size_spread()
    # A minute's conditions as simulate draws them: the hourly drift at a uniform phase, and a
    # batch in progress the share of the time batches run (starting only when none runs).
    mix = np.sin(rng.uniform(0, 2 * math.pi, DRAWS))
    long = (pop.batch_min[0] + pop.batch_min[1]) / 2 * pop.batches_a_day
    pdf = rng.random(DRAWS) < long / (1440 + long)
    batch_p, batch_q, batch_f = pop.batch_factors
    drift_f, drift_q = pop.drift
    out: dict[str, dict[str, float]] = {}
    # Failed: 0/1 with chance p_i; the minute's conditions scale it.
    scale = np.exp(drift_f * mix) * np.where(pdf, batch_f, 1.0)
    p = np.clip(pop.failure_of(sizes) * scale, 0, 1)
    p_bar = float(p.mean())
    by_minute = pop.document_failure() * scale  # the minute's mean over sizes
    pooled = p_bar * (1 - p_bar)
    out["failed"] = {
        "pooled": pooled,
        "within": pooled - float(by_minute.var()),
        "covariate": float((p * (1 - p)).mean()),
    }
    # Times: the same draw with and without the minute's shift and the covariate's part.
    noise_p = pop.residual_sigma * rng.standard_normal(DRAWS)
    noise_q = pop.queue_sigma * rng.standard_normal(DRAWS)
    covariate = pop.covariate * (np.log(sizes) - mean_log)
    shift_p = drift_f * mix + np.log(np.where(pdf, batch_p, 1.0))
    shift_q = drift_q * mix + np.log(np.where(pdf, batch_q, 1.0))
    for name, median, noise, shift, cov in (
        ("processing", pop.processing_ms, noise_p, shift_p, covariate),
        ("queue_wait", pop.queue_ms, noise_q, shift_q, np.zeros(DRAWS)),
    ):
        out[name] = {
            "pooled": float(_scores(median * np.exp(noise + cov + shift)).var()),
            "within": float(_scores(median * np.exp(noise + cov)).var()),
            "covariate": float(_scores(median * np.exp(noise)).var()),
        }
    return out


def bound(
    plan: Defaults, sigma2: dict[str, dict[str, float]], power: float, kind: str
) -> tuple[list[float], list[str]]:
    """Per step: the documents (both paths) the fixed-horizon test needs, and the margin that
    needs the most; the last step needs none."""
    z = norm.ppf(1 - plan.margin_alpha) + norm.ppf(power)
    shares = [min(s, 100 - plan.holdback) / 100 for s in plan.steps]
    next_shares = [s / 100 for s in plan.steps[1:]]
    need, binding = [], []
    for share, next_share in zip(shares[:-1], next_shares, strict=True):
        each = {
            name: z**2
            * sigma2[name][kind]
            / (margin_at(name, plan.margins[name], next_share) ** 2 * share * (1 - share))
            for name in MARGIN_TESTS
        }
        name = max(each, key=lambda k: each[k])
        need.append(each[name])
        binding.append(name)
    return [*need, 0.0], [*binding, "-"]


def carried(
    plan: Defaults, sigma2: dict[str, dict[str, float]], power: float, kind: str
) -> list[float]:
    """Per step, the documents the same test needs when each step keeps the evidence of the
    steps before it, as the gate does (its window starts with the rollout): a step needs the
    effective documents ``W`` its own margins need, less those it carries, at ``s (1 - s)`` a
    document. The least any design of these steps can do; ``bound`` prices each step fresh."""
    z = norm.ppf(1 - plan.margin_alpha) + norm.ppf(power)
    shares = [min(s, 100 - plan.holdback) / 100 for s in plan.steps]
    have, need = 0.0, []
    for share, next_share in zip(shares[:-1], [s / 100 for s in plan.steps[1:]], strict=True):
        wanted = max(
            z**2 * sigma2[name][kind] / margin_at(name, plan.margins[name], next_share) ** 2
            for name in MARGIN_TESTS
        )
        need.append(max(wanted - have, 0.0) / (share * (1 - share)))
        have = max(have, wanted)
    return [*need, 0.0]


def premium(rng: np.random.Generator, alpha: float, paths: int = 20_000) -> None:
    """What anytime validity costs over the fixed horizon, on its own: A/A Brownian sums (unit
    variance, margin 1, excess 0) watched continuously with the mixture bound at several
    ``RHO_FRACTION``s (``rho_for``'s at the shipped one, scaled), and the effective documents at
    which the margin is shown, p50 against the fixed horizon at power 50 % and p95 at 95 %.
    Ville's inequality puts the p50 at about 2 ln(1/alpha) / z_alpha^2 of the fixed horizon or
    more, whatever the tuning."""
    z_a, z_b = norm.ppf(1 - alpha), norm.ppf(0.95)
    fixed50, fixed95 = z_a**2, (z_a + z_b) ** 2
    dw, top = 0.05, 60.0
    grid = np.arange(1, int(top / dw) + 1) * dw
    sums = np.cumsum(rng.normal(0, math.sqrt(dw), (paths, grid.size)), axis=1)
    print(
        f"\nanytime validity's price alone ({paths} Brownian A/A paths, alpha {alpha:g}): "
        f"2 ln(1/alpha) / z^2 = {2 * math.log(1 / alpha) / fixed50:.2f}"
    )
    for scale in (0.3, 0.5, 1.0, 2.0, 5.0, 10.0):
        rho = rho_for(1.0, 1.0, alpha) * scale
        radius, _ = mixture_radius(grid, rho, alpha)
        shown = (sums + radius) / grid < 1
        first = grid[np.where(shown.any(axis=1), shown.argmax(axis=1), grid.size - 1)]
        p50, p95 = np.percentile(first, [50, 95])
        print(
            f"  RHO_FRACTION {RHO_FRACTION * scale:<5g} p50 {p50 / fixed50:.2f}x the fixed "
            f"horizon at power 50 %, p95 {p95 / fixed95:.2f}x at 95 %"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents-per-min", default="5,25", help="loads the gate is run at")
    parser.add_argument("--runs", type=int, default=60, help="A/A runs a load")
    parser.add_argument("--population", default=HELD_OUT.name, choices=ROLLOUT_POPULATIONS)
    parser.add_argument("--seed", type=int, default=3602, help="not a seed the gate was tuned on")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    pop = ROLLOUT_POPULATIONS[args.population]
    plan = Defaults()
    print(loadavg())
    started = time.monotonic()
    sigma2 = variances(rng, pop)
    print(
        f"population {pop.name}, seed {args.seed}; GATE_MARGIN_ALPHA={plan.margin_alpha:g} "
        f"one-sided, margins {plan.margins}, steps {','.join(f'{s:g}' for s in plan.steps)}"
    )
    print("one document's variance (gate's units):")
    for name, kinds in sigma2.items():
        print(f"  {name:<11} " + "  ".join(f"{k} {v:.4g}" for k, v in kinds.items()))
    bounds = {
        (power, kind): bound(plan, sigma2, power, kind)
        for power in (0.5, 0.95)
        for kind in ("within", "pooled", "covariate")
    }
    print("\nthe bound: documents a step (both paths), and hours at each rate (statistics only)")
    kept = {power: carried(plan, sigma2, power, "within") for power in (0.5, 0.95)}
    header = (
        f"{'step':>5} {'power':>6} {'binding':>11} {'within':>8} {'pooled':>8} {'cov.':>7} "
        f"{'carried':>8}"
    )
    print(header + "".join(f" {f'h@{r:g}/min':>9}" for r in RATES))
    for power in (0.5, 0.95):
        need, binding = bounds[(power, "within")]
        for i, step in enumerate(plan.steps):
            cells = [bounds[(power, kind)][0][i] for kind in ("within", "pooled", "covariate")]
            print(
                f"{step:>4g}% {100 * power:>5.0f}% {binding[i]:>11} "
                + " ".join(f"{c:>8,.0f}" for c in cells)
                + f" {kept[power][i]:>8,.0f}"
                + "".join(f" {need[i] / (60 * r):>9.2f}" for r in RATES)
            )
        total = [sum(bounds[(power, kind)][0]) for kind in ("within", "pooled", "covariate")]
        print(
            f"{'total':>5} {100 * power:>5.0f}% {'':>11} "
            + " ".join(f"{c:>8,.0f}" for c in total)
            + f" {sum(kept[power]):>8,.0f}"
            + "".join(f" {total[0] / (60 * r):>9.2f}" for r in RATES)
        )
    ok = True
    for load in (float(x) for x in args.documents_per_min.split(",")):
        out = simulate(
            rng, Scenario("A/A"), plan, args.runs, documents_per_min=load, population=pop
        )
        reached = out.reached_min >= 0
        print(
            f"\nthe gate, {args.runs} A/A runs at {load:g} documents/min ({int(reached.sum())} "
            "reached 100 %): documents to promote each step (both paths) against the bound "
            "(within; carried in brackets)"
        )
        print(
            f"{'step':>5} {'gate p50':>9} {'bound 50%':>10} {'ratio':>14} "
            f"{'gate p95':>9} {'bound 95%':>10} {'ratio':>14}"
        )
        docs = out.step_docs.sum(axis=2)  # runs, steps
        for i, step in enumerate(plan.steps):
            done = ~np.isnan(docs[:, i])
            p50, p95 = np.percentile(docs[done, i], [50, 95]) if done.any() else (np.nan,) * 2
            row = [f"{step:>4g}%"]
            for gate, power in ((p50, 0.5), (p95, 0.95)):
                b = bounds[(power, "within")][0][i]
                kept_i = kept[power][i]
                ratio = f"{gate / b:.2f} ({gate / kept_i:.2f})" if b > 0 else "(dwell only)"
                row.append(f"{gate:>9,.0f} {b:>10,.0f} {ratio:>14}")
            print(" ".join(row))
        # Documents to 100 %: a run's sum over its steps; runs that never reached count as
        # more than any that did.
        totals = np.where(reached, np.nansum(docs, axis=1), np.inf)
        p50, p95 = np.percentile(totals, [50, 95])
        row, met = [f"{'total':>5}"], True
        for gate, power in ((p50, 0.5), (p95, 0.95)):
            b = sum(bounds[(power, "within")][0])
            kept_all = sum(kept[power])
            row.append(f"{gate:>9,.0f} {b:>10,.0f} {f'{gate / b:.2f} ({gate / kept_all:.2f})':>14}")
            met &= bool(gate / b <= TARGET_RATIO)
        ok &= met
        print(" ".join(row) + f"  target <= {TARGET_RATIO:g}x: {'ok' if met else 'MISSED'}")
    premium(rng, plan.margin_alpha)
    print(f"\n{time.monotonic() - started:.0f} s; {loadavg()}")
    print("every target met" if ok else "a target was MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
