"""The composition root: builds every client once, wires the stages, runs and supervises them."""

from sidecar.app.service import Sidecar
from sidecar.app.state_store import eviction_warnings, shares_ragflows_valkey, warn_if_evicting
from sidecar.app.supervisor import run_until_signal
from sidecar.app.wiring import StandaloneMirror

# The process and how it runs.
__all__ = [
    "Sidecar",
    "StandaloneMirror",
    "run_until_signal",
]
# The state store's Valkey, checked at start and by status and doctor.
__all__ += [
    "eviction_warnings",
    "shares_ragflows_valkey",
    "warn_if_evicting",
]
