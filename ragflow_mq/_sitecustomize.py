"""What ``sitecustomize.py`` runs in a RAGFlow process that asks for the split (or sets a
share): ``install()``, or no start at all.

Python's start-up reports an exception raised in sitecustomize and carries on, which would
run RAGFlow on a configuration it was told was wrong; a bad setting ends the process here
instead, with the variable named. With the default backend and no share, sitecustomize does not
import this module (nor the package) at all.
"""

from __future__ import annotations

import os
import sys

from ragflow_mq.install import install
from sidecar.errors import ConfigError

try:
    install()
except ConfigError as exc:
    sys.stderr.write(f"ragflow_mq: error: {exc}\n")
    sys.stderr.flush()
    os._exit(2)
