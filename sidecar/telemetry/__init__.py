"""telemetry: traces (``tracing``, with ``semconv``, ``propagation``, ``sampler``, ``export``),
metrics and health."""
