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
from sidecar.config.serve import GATE_VARIABLES, SERVE_VARIABLES, GateSettings, ServeSettings
from sidecar.config.service_conf import expand_variables
from sidecar.config.settings import KNOWN_VARIABLES, Settings
from sidecar.transport.options import KafkaSettings, RedisSettings, Secret, SecurityProtocol

__all__ = [
    "GATE_VARIABLES",
    "KNOWN_VARIABLES",
    "MQ_BACKENDS",
    "SERVE_VARIABLES",
    "GateSettings",
    "KafkaSettings",
    "MQBackend",
    "MetricsSettings",
    "MirrorSettings",
    "RedisSettings",
    "Secret",
    "SecurityProtocol",
    "ServeSettings",
    "Settings",
    "ShadowSettings",
    "TracingSettings",
    "expand_variables",
]
