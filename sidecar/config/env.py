"""The environment reader and its tables: every variable declared beside the field it feeds.

A :class:`Table` lists a settings class's variables, one :class:`Var` row per variable with the
field it feeds and how its text is parsed. The variables the sidecar knows (and takes from the
environment) are exactly its tables' rows, and a builder reads only through a :class:`Reader`
limited to its table: a variable cannot be read without being known. A row either parses its
field itself or its builder must compute that field, so a known variable feeds a field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from sidecar.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class Value:
    """One setting's text, and where it came from."""

    text: str
    origin: str  # what to name in an error: the variable, or the file key it came from


class Reader:
    """Typed access to the merged values; every error names where the bad value came from.

    A reader reads only the variables it was given: :meth:`Table.reader` gives it a table's.
    """

    def __init__(
        self,
        values: Mapping[str, Value],
        names: Iterable[str],
        consulted: set[str] | None = None,
    ) -> None:
        self._values = values
        self._names = frozenset(names)
        # Every variable looked up, for the check that each known one is read somewhere.
        self.consulted: set[str] = set() if consulted is None else consulted

    def limited_to(self, names: Iterable[str]) -> Reader:
        """This reader, for ``names`` only; they must be among the ones it may read."""
        names = tuple(names)
        unknown = [name for name in names if name not in self._names]
        if unknown:
            raise LookupError(f"not known variables: {', '.join(unknown)}")
        return Reader(self._values, names, self.consulted)

    def _value(self, name: str) -> Value | None:
        if name not in self._names:
            raise LookupError(f"{name} is read, but no row of this table declares it")
        self.consulted.add(name)
        return self._values.get(name)

    def origin(self, name: str) -> str:
        """The variable's name, with the file key beside it when the value came from a file."""
        value = self._value(name)
        if value is None or value.origin == name:
            return name
        return f"{name} ({value.origin})"

    def error(self, name: str, problem: str) -> ConfigError:
        """The error to raise for a bad value of ``name``."""
        return ConfigError(self.origin(name), problem)

    def text(self, name: str, default: str | None) -> str | None:
        value = self._value(name)
        return value.text if value is not None else default

    def required_text(self, name: str, default: str) -> str:
        text = self.text(name, default)
        assert text is not None
        return text

    def integer(self, name: str, default: int, minimum: int, maximum: int | None = None) -> int:
        text = self.text(name, None)
        if text is None:
            return default
        try:
            number = int(text)
        except ValueError:
            raise self.error(name, f"{text!r} is not a whole number") from None
        if number < minimum or (maximum is not None and number > maximum):
            bound = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
            raise self.error(name, f"{number} is out of range (must be {bound})")
        return number

    def number(self, name: str, default: float, minimum: float, maximum: float) -> float:
        text = self.text(name, None)
        if text is None:
            return default
        try:
            number = float(text)
        except ValueError:
            raise self.error(name, f"{text!r} is not a number") from None
        if not minimum <= number <= maximum:  # also rejects NaN
            raise self.error(name, f"{text} is out of range (must be from {minimum} to {maximum})")
        return number

    def names(self, name: str, default: tuple[str, ...]) -> tuple[str, ...]:
        text = self.text(name, None)
        if text is None:
            return default
        items = tuple(part.strip() for part in text.split(",") if part.strip())
        if not items:
            raise self.error(name, "needs at least one name")
        return items

    def choice(self, name: str, choices: tuple[str, ...], default: str, upper: bool) -> str:
        text = self.required_text(name, default)
        normalised = text.upper() if upper else text.lower()
        if normalised not in choices:
            raise self.error(name, f"unknown value {text!r}; expected one of {', '.join(choices)}")
        return normalised


Parse = Callable[[Reader, str, Any, Mapping[str, Any]], Any]
"""How a row's variable becomes its field's value: called with the reader, the variable, the
field's default and the fields of the rows above it (which a value may depend on)."""


@dataclass(frozen=True)
class Var:
    """One row of a :class:`Table`: an environment variable and the field it feeds."""

    name: str
    field: str
    # None: the table's builder computes the field, from this variable and others.
    parse: Parse | None = None


class Table(Generic[T]):
    """A settings class's variables, one row each; the only ones its builder may read."""

    def __init__(self, settings: Callable[..., T], *rows: Var) -> None:
        self._settings = settings
        self._rows = rows
        self.names: tuple[str, ...] = tuple(dict.fromkeys(row.name for row in rows))
        self._computed = frozenset(row.field for row in rows if row.parse is None)

    def reader(self, reader: Reader) -> Reader:
        """``reader`` limited to this table's variables, for a builder's own reads."""
        return reader.limited_to(self.names)

    def build(self, reader: Reader, **computed: Any) -> T:
        """The settings: the rows that parse themselves, in order, and the ``computed`` fields.

        ``computed`` must hold every field of a row without a parser (and may hold fields that
        no variable feeds directly)."""
        missing = self._computed - computed.keys()
        if missing:
            raise TypeError(f"fields declared but not computed: {', '.join(sorted(missing))}")
        env = self.reader(reader)
        defaults = self._settings()
        fields: dict[str, Any] = {}
        for row in self._rows:
            if row.parse is not None:
                fields[row.field] = row.parse(env, row.name, getattr(defaults, row.field), fields)
        return self._settings(**fields, **computed)


def text() -> Parse:
    """The text as it is."""
    return lambda reader, name, default, _: reader.text(name, default)


def integer(minimum: int, maximum: int | None = None) -> Parse:
    """A whole number in ``[minimum, maximum]``."""
    return lambda reader, name, default, _: reader.integer(name, default, minimum, maximum)


def number(minimum: float, maximum: float) -> Parse:
    """A number in ``[minimum, maximum]``."""
    return lambda reader, name, default, _: reader.number(name, default, minimum, maximum)


def names() -> Parse:
    """A comma-separated list of at least one name."""
    return lambda reader, name, default, _: reader.names(name, default)


def choice(choices: tuple[str, ...], upper: bool = False) -> Parse:
    """One of ``choices``, case-insensitively (normalised to their case)."""
    return lambda reader, name, default, _: reader.choice(name, choices, default, upper)


def existing_file(reader: Reader, name: str, default: Any, fields: Mapping[str, Any]) -> Any:
    """The path of a file that exists, or the default when unset."""
    path = reader.text(name, default)
    if path is not None and not Path(path).is_file():
        raise reader.error(name, f"no such file: {path}")
    return path
