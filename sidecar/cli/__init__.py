"""``ragflow-sidecar``: the command line and the read-only commands (status, diffs, reconcile)."""
