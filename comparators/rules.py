"""Which differences count, per task type, and how they are read from YAML or TOML files.

File format (YAML shown; TOML has the same tables)::

    default:
      exclude_paths: [progress_msg]            # readable paths, wildcards * and ** allowed
      exclude_regex_paths: ['(^|\\.)update_(time|date)$']   # re.search on readable paths
      significant_digits: 3
      ignore_order: false
      ignore_numeric_type_changes: true        # 1 equals 1.0
    task_types:
      memory:
        exclude_paths: [task.message_dict]     # added to the default's
        ignore_order: true                     # replaces the default's
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

import yaml

from comparators.errors import RulesError
from comparators.paths import to_deepdiff_path

_LIST_KEYS: Final = ("exclude_paths", "exclude_regex_paths")
_BOOL_KEYS: Final = ("ignore_order", "ignore_numeric_type_changes")
_RULE_KEYS: Final = (*_LIST_KEYS, "significant_digits", *_BOOL_KEYS)
_TOP_KEYS: Final = ("default", "task_types")


def _check_strings(values: Any, key: str) -> tuple[str, ...]:
    # A lone string would otherwise be iterated character by character.
    if not isinstance(values, list | tuple):
        raise RulesError(f"must be a list of strings, not {type(values).__name__}", key=key)
    for index, value in enumerate(values):
        if not isinstance(value, str):
            raise RulesError(f"must be a string, not {type(value).__name__}", key=f"{key}[{index}]")
    return tuple(values)


def _deepdiff_paths(paths: tuple[str, ...]) -> tuple[str, ...]:
    converted = []
    for index, path in enumerate(paths):
        try:
            converted.append(to_deepdiff_path(path))
        except ValueError as exc:
            raise RulesError(str(exc), key=f"exclude_paths[{index}]") from None
    return tuple(converted)


def _compile(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    compiled = []
    for index, pattern in enumerate(patterns):
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise RulesError(
                f"bad regular expression {pattern!r}: {exc}", key=f"exclude_regex_paths[{index}]"
            ) from None
    return tuple(compiled)


@dataclass(frozen=True, slots=True)
class TypeRules:
    """Comparison rules for one task type; paths are readable (``pages.to_page``)."""

    exclude_paths: tuple[str, ...] = ()
    exclude_regex_paths: tuple[str, ...] = ()
    significant_digits: int | None = None
    ignore_order: bool = False
    ignore_numeric_type_changes: bool = False
    # Converted once here rather than on every comparison.
    deepdiff_exclude_paths: tuple[str, ...] = field(init=False, repr=False, compare=False)
    regexes: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_strings(self.exclude_paths, "exclude_paths")
        _check_strings(self.exclude_regex_paths, "exclude_regex_paths")
        digits = self.significant_digits
        if digits is not None and (not isinstance(digits, int) or isinstance(digits, bool)):
            raise RulesError(
                f"must be an integer or null, not {type(digits).__name__}", key="significant_digits"
            )
        if digits is not None and digits < 0:
            raise RulesError(f"must not be negative, got {digits}", key="significant_digits")
        for key in _BOOL_KEYS:
            if not isinstance(getattr(self, key), bool):
                raise RulesError(f"must be true or false, not {getattr(self, key)!r}", key=key)
        object.__setattr__(self, "exclude_paths", tuple(self.exclude_paths))
        object.__setattr__(self, "exclude_regex_paths", tuple(self.exclude_regex_paths))
        object.__setattr__(self, "deepdiff_exclude_paths", _deepdiff_paths(self.exclude_paths))
        object.__setattr__(self, "regexes", _compile(self.exclude_regex_paths))

    def merged(self, overrides: Mapping[str, Any]) -> TypeRules:
        """These rules with ``overrides`` applied: lists are appended to, scalars replaced."""
        changes: dict[str, Any] = dict(overrides)
        for key in _LIST_KEYS:
            if key in changes:
                # dict.fromkeys drops repeats and keeps the order.
                changes[key] = tuple(dict.fromkeys((*getattr(self, key), *changes[key])))
        return replace(self, **changes)


def _fields(raw: Any, key: str) -> dict[str, Any]:
    """Checked rule fields of one table: only those given, so that overrides can merge."""
    if not isinstance(raw, Mapping):
        raise RulesError(f"must be a table of rules, not {type(raw).__name__}", key=key)
    fields: dict[str, Any] = {}
    for name, value in raw.items():
        where = f"{key}.{name}"
        if name not in _RULE_KEYS:
            raise RulesError(f"unknown key; expected one of {', '.join(_RULE_KEYS)}", key=where)
        if name in _LIST_KEYS:
            fields[name] = _check_strings(value, where)
        else:
            fields[name] = value
    try:
        TypeRules(**fields)  # checks types, paths and regular expressions
    except RulesError as exc:
        raise exc.located(prefix=key) from None
    return fields


@dataclass(frozen=True, slots=True)
class CompareRules:
    """Default rules and the effective (already merged) rules of some task types."""

    default: TypeRules = field(default_factory=TypeRules)
    task_types: Mapping[str, TypeRules] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "task_types", MappingProxyType(dict(self.task_types)))

    def for_task_type(self, task_type: str) -> TypeRules:
        """The rules of ``task_type``; the default for a type without its own."""
        return self.task_types.get(task_type, self.default)

    @classmethod
    def from_mapping(cls, data: Any, source: str = "<mapping>") -> CompareRules:
        """Rules from parsed YAML/TOML; ``RulesError`` naming ``source`` and the key at fault."""
        try:
            return cls._from_mapping(data)
        except RulesError as exc:
            raise exc.located(source=source) from None

    @classmethod
    def _from_mapping(cls, data: Any) -> CompareRules:
        if data is None:  # an empty YAML file
            return cls()
        if not isinstance(data, Mapping):
            raise RulesError(f"must be a table, not {type(data).__name__}", key="(top level)")
        for name in data:
            if name not in _TOP_KEYS:
                raise RulesError(
                    f"unknown key; expected one of {', '.join(_TOP_KEYS)}", key=str(name)
                )
        default = TypeRules(**_fields(data.get("default", {}), "default"))
        raw_types = data.get("task_types", {})
        if not isinstance(raw_types, Mapping):
            raise RulesError(
                f"must be a table of task types, not {type(raw_types).__name__}", key="task_types"
            )
        task_types = {}
        for task_type, raw in raw_types.items():
            if not isinstance(task_type, str) or not task_type:
                raise RulesError("task type names must be non-empty strings", key="task_types")
            task_types[task_type] = default.merged(_fields(raw, f"task_types.{task_type}"))
        return cls(default, task_types)


def load_rules(path: str | os.PathLike[str]) -> CompareRules:
    """Rules from a ``.yaml``/``.yml`` or ``.toml`` file; any problem is a ``RulesError``."""
    source = os.fspath(path)
    suffix = Path(source).suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml"):
        raise RulesError(f"unknown extension {suffix!r}; use .yaml, .yml or .toml", source=source)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RulesError(f"cannot read: {exc}", source=source) from None
    try:
        data = tomllib.loads(text) if suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        kind = "TOML" if suffix == ".toml" else "YAML"
        raise RulesError(f"not valid {kind}: {exc}", source=source) from None
    return CompareRules.from_mapping(data, source=source)
