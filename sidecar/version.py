"""The package version: a leaf module, so that telemetry and the CLI name it without importing
the package root (whose lazy public names would otherwise close import cycles)."""

__version__ = "0.1.0"
