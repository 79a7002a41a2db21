"""The sidecar's configuration: one typed, validated object, read from the environment here only.

Values come from, in rising precedence: built-in defaults, an optional RAGFlow
``service_conf.yaml`` (its ``redis:``, ``kafka:`` and ``mq:`` sections, with ``${VAR:-default}``
expansion as RAGFlow's template uses it), and environment variables. A missing, unknown or
malformed value raises :class:`~sidecar.errors.ConfigError` naming the variable. Passwords are
kept in :class:`Secret`, which never shows its value in a repr, str or log line.

The modules: ``model`` (the sections' dataclasses), ``env`` (the reader and its variable →
field tables), ``settings`` (:class:`Settings` and each section's table), ``serve`` (the served
share and the gate), ``service_conf`` (the YAML file); ``routing`` and ``traffic`` are read by
the stages at run time.
"""

from sidecar.config.model import (
    MQ_BACKENDS,
    MetricsSettings,
    MirrorSettings,
    MQBackend,
    ShadowSettings,
    TracingSettings,
)
from sidecar.config.rollout import RolloutSettings, check_plan
from sidecar.config.routing import KNOWN_TASK_TYPES, Route, RouteTable
from sidecar.config.serve import GATE_VARIABLES, SERVE_VARIABLES, GateSettings, ServeSettings
from sidecar.config.service_conf import expand_variables
from sidecar.config.settings import KNOWN_VARIABLES, Settings
from sidecar.config.traffic import in_traffic_share
from sidecar.transport.options import KafkaSettings, RedisSettings, Secret, SecurityProtocol

# The settings object and where its values come from.
__all__ = [
    "KNOWN_VARIABLES",
    "Settings",
    "expand_variables",
]
# Its sections.
__all__ += [
    "GATE_VARIABLES",
    "MQ_BACKENDS",
    "SERVE_VARIABLES",
    "GateSettings",
    "KafkaSettings",
    "MQBackend",
    "MetricsSettings",
    "MirrorSettings",
    "RedisSettings",
    "RolloutSettings",
    "Secret",
    "SecurityProtocol",
    "ServeSettings",
    "ShadowSettings",
    "TracingSettings",
    "check_plan",
]
# The routing built from RAGFlow's task kinds (the table itself is ``sidecar.config.task_kinds``,
# read as a module) and the traffic share, read by the stages and ragflow_mq at run time.
__all__ += [
    "KNOWN_TASK_TYPES",
    "Route",
    "RouteTable",
    "in_traffic_share",
]
