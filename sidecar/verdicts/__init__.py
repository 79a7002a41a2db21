"""Stage 4: join both runs of an entry, compare them, publish and read back verdicts."""

from sidecar.verdicts.compare import MISMATCH_COMPARATORS
from sidecar.verdicts.join import ALIVE_PREFIX, SEEN_PREFIX, Arrival, EntryRef
from sidecar.verdicts.judge import Judge, JudgeStats, digest_or_none
from sidecar.verdicts.model import (
    RENAMED_VERDICTS,
    VERDICT_COUNTS_KEY,
    VERDICTS,
    VerdictRecord,
    canonical_verdict,
)
from sidecar.verdicts.progress import ShadowProgress
from sidecar.verdicts.reader import (
    VerdictFollower,
    VerdictReadStats,
    int_or_minus_one,
    parse_since,
    read_verdicts,
)
from sidecar.verdicts.sweeper import Sweeper
from sidecar.verdicts.trace import PROCESS_TRACEPARENT

# The join: what each run hands on.
__all__ = [
    "ALIVE_PREFIX",
    "SEEN_PREFIX",
    "Arrival",
    "EntryRef",
]
# The judge and its sweeper.
__all__ += [
    "MISMATCH_COMPARATORS",
    "PROCESS_TRACEPARENT",
    "Judge",
    "JudgeStats",
    "Sweeper",
    "digest_or_none",
]
# Verdicts and reading them back.
__all__ += [
    "RENAMED_VERDICTS",
    "VERDICTS",
    "VERDICT_COUNTS_KEY",
    "ShadowProgress",
    "VerdictFollower",
    "VerdictReadStats",
    "VerdictRecord",
    "canonical_verdict",
    "int_or_minus_one",
    "parse_since",
    "read_verdicts",
]
