"""Grafana dashboards of the sidecar, as code (Grafana's grafana-foundation-sdk).

    python dashboards/generate.py          # writes the JSON files beside this script
    python dashboards/generate.py --check  # exits 1 if the committed JSON is not what this makes

Every Prometheus query names only metrics from ``docs/metrics.md`` (``tests/test_dashboards.py``
checks the names, ``tests/test_prometheus.py`` runs each query against a real Prometheus fed by
a real sidecar). The dashboards are tables of panel specs: ``overview.py`` (its served-share and
autopilot rows, and the autopilot's annotations, in ``served_share.py``) and ``drill_down.py``;
the panel kinds are in ``panels.py`` (annotations in ``annotations.py``), the queries' helpers
and data sources in ``queries.py``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model

HERE = Path(__file__).resolve().parent
if not __package__:
    # Run as a script (python dashboards/generate.py), the repository root is not on the path,
    # and the dashboards import their panels as dashboards.*: hence the imports below it.
    sys.path.insert(0, str(HERE.parent))

from dashboards.drill_down import drill_down  # noqa: E402
from dashboards.overview import overview  # noqa: E402

OVERVIEW_FILE = "shadow-migration-overview.json"
DRILL_DOWN_FILE = "diff-drill-down.json"

DASHBOARDS: dict[str, Callable[[], Builder[model.Dashboard]]] = {
    OVERVIEW_FILE: overview,
    DRILL_DOWN_FILE: drill_down,
}


def render(make: Callable[[], Builder[model.Dashboard]]) -> str:
    return json.dumps(make().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the committed JSON is out of date"
    )
    parser.add_argument("--out", type=Path, default=HERE, help="directory of the JSON files")
    args = parser.parse_args(argv)
    stale = []
    for name, make in DASHBOARDS.items():
        path: Path = args.out / name
        wanted = render(make)
        if not args.check:
            path.write_text(wanted, encoding="utf-8")
            print(f"wrote {path}")
            continue
        have = path.read_text(encoding="utf-8") if path.exists() else ""
        if have != wanted:
            stale.append(name)
            diff = difflib.unified_diff(
                have.splitlines(),
                wanted.splitlines(),
                f"{name} (committed)",
                f"{name} (generated)",
                lineterm="",
                n=1,
            )
            print("\n".join(list(diff)[:40]), file=sys.stderr)
    if stale:
        print(
            f"out of date: {', '.join(stale)}; run `python dashboards/generate.py`",
            file=sys.stderr,
        )
        return 1
    if args.check:
        print("dashboards are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
