"""``ragflow-sidecar``: the command line and the read-only commands (status, diffs, reconcile)."""

from __future__ import annotations

import importlib.util
import sys

# What only the sidecar process imports: pyproject's [sidecar] extra. The plain wheel (RAGFlow's
# image installs it for ragflow_mq) also puts the ragflow-sidecar command on PATH; without the
# extra, it says so rather than failing on the first missing import.
SIDECAR_EXTRA_MODULES = (
    "deepdiff",
    "opentelemetry.sdk",
    "opentelemetry.exporter.prometheus",
    "prometheus_client",
    "scipy",
)


def missing_modules(names: tuple[str, ...] = SIDECAR_EXTRA_MODULES) -> list[str]:
    """Those of ``names`` that cannot be imported here."""
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except ImportError:  # a parent package is missing
            found = False
        if not found:
            missing.append(name)
    return missing


if _missing := missing_modules():
    sys.stderr.write(
        f"ragflow-sidecar: error: {', '.join(_missing)} not installed: the sidecar needs its "
        "extra, pip install 'ragflow-kafka-sidecar[sidecar]' (the plain install is ragflow_mq's, "
        "for RAGFlow's processes)\n"
    )
    raise SystemExit(2)

# Only after the check above: these need the extra. The entry point, ``main``, stays in
# sidecar.cli.main (exporting it would hide that module behind the function).
from sidecar.cli.diffs import render_diffs  # noqa: E402
from sidecar.cli.roundtrip import round_trip  # noqa: E402

# What the demo renders and runs.
__all__ = [
    "render_diffs",
    "round_trip",
]
