"""What ``sitecustomize.py`` runs in each RAGFlow process: ``install()``, or no start at all.

Python's start-up reports an exception raised in sitecustomize and carries on, which would
run RAGFlow on a configuration it was told was wrong; a bad setting ends the process here
instead, with the variable named.
"""

from __future__ import annotations

import os
import sys

# Every Python process of RAGFlow's container starts through here: with the default backend
# and no served share asked for, nothing more is imported at all. Anything else, a wrong value
# or a share set with MQ_BACKEND=redis included, is read and checked.
if (
    os.environ.get("MQ_BACKEND", "").strip() not in ("", "redis")
    or os.environ.get("KAFKA_SERVE_PERCENT", "").strip()
):
    from ragflow_mq.install import install
    from sidecar.errors import ConfigError

    try:
        install()
    except ConfigError as exc:
        sys.stderr.write(f"ragflow_mq: error: {exc}\n")
        sys.stderr.flush()
        os._exit(2)
