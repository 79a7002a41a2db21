"""The executed share, sidecar side: the gate, drain-to-redis and the served evidence as metrics."""
