"""Which spans are sampled: ``OTEL_TRACES_SAMPLER``/``_ARG``, plus the sidecar's two rules.

``OTEL_TRACES_SAMPLER``/``_ARG`` decide per batch: a batch's ``send`` spans are its children, so a
batch is traced whole or not at all. The spans that continue a task (``run redis``, ``process``,
``compare``) are children of its record's producer context when that was sampled, which the samplers
follow; under the ``parentbased_*`` samplers a root span that continues a message through a link
only (a context not sampled) follows the link's sampled flag, so a task is traced from Redis to its
verdict or not at all; records of unsampled batches carry the batch span's context with the sampled
flag off, which keeps that decision downstream. A ``compare`` span whose verdict is ``mismatch``,
``error``, ``missing_in_kafka`` or ``missing_in_redis`` is always sampled: its sampler sees the
``verdict`` attribute at start (the span is started once the verdict is known, with the comparison's
start time), and forces the decision on, whatever the ratio. When the producer's context was sampled
it is a span of the task's trace; when not, it is a trace of its own, linked to that context; it
goes through an export queue of its own (:mod:`sidecar.telemetry.export`), so a flood of ordinary
spans cannot push it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import Attributes

from sidecar.telemetry.semconv import VERDICT

__all__ = ["ALWAYS_EXPORTED_VERDICTS", "VerdictSampler", "build_sampler", "follows_links"]

# Verdicts whose compare span is exported whatever the sampler says.
ALWAYS_EXPORTED_VERDICTS: Final = frozenset(
    {"mismatch", "error", "missing_in_kafka", "missing_in_redis"}
)


class VerdictSampler(Sampler):
    """The configured sampler, plus: bad verdicts always sampled, linked roots follow the link.

    - A span whose ``verdict`` attribute is in :data:`ALWAYS_EXPORTED_VERDICTS` is sampled.
    - With ``follow_links`` (the ``parentbased_*`` samplers), a root CONSUMER or INTERNAL span
      with links is sampled if one of the linked contexts was: it continues that message.
    - Anything else is the ``delegate``'s decision.
    """

    def __init__(self, delegate: Sampler, *, follow_links: bool) -> None:
        self._delegate = delegate
        self._follow_links = follow_links

    def should_sample(  # noqa: PLR0917 - the SDK's signature
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: trace.TraceState | None = None,
    ) -> SamplingResult:
        if attributes and attributes.get(VERDICT) in ALWAYS_EXPORTED_VERDICTS:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
        if (
            self._follow_links
            and links
            and kind in (SpanKind.CONSUMER, SpanKind.INTERNAL)
            and not trace.get_current_span(parent_context).get_span_context().is_valid
        ):
            if any(link.context.trace_flags.sampled for link in links):
                return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
            return SamplingResult(Decision.DROP)
        return self._delegate.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"VerdictSampler{{{self._delegate.get_description()}}}"


def build_sampler(name: str, ratio: float) -> VerdictSampler:
    """The sampler ``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG`` name, as a VerdictSampler."""
    base = name.removeprefix("parentbased_")
    root: Sampler = {"always_on": ALWAYS_ON, "always_off": ALWAYS_OFF}.get(base) or (
        TraceIdRatioBased(ratio)
    )
    parent_based = follows_links(name)
    return VerdictSampler(ParentBased(root) if parent_based else root, follow_links=parent_based)


def follows_links(name: str) -> bool:
    """Whether the sampler ``name`` makes a linked root span follow its link's sampled flag."""
    return name.startswith("parentbased_")
