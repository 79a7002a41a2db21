"""Readable paths (``pages.to_page``, ``doc_ids[2]``) and their translation to deepdiff's.

Grammar: dict keys are written bare (``task.doc_id``) unless they hold whitespace, dots,
brackets or quotes, then quoted in brackets (``meta['a.b']``); list indices are ``[n]``;
``*`` (or ``[*]``) matches one segment and ``**`` any number, in exclusion rules only. The
root is the empty string.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from enum import Enum
from functools import lru_cache

from deepdiff import parse_path
from deepdiff.path import stringify_element


class Wildcard(Enum):
    """A wildcard segment: ``*`` one segment, ``**`` zero or more."""

    ONE = "*"
    ANY = "**"


Segment = str | int | Wildcard

_BARE = re.compile(r"[^.\[\]'\"\s]+")
_BRACKET = re.compile(
    r"""\[(?:(?P<int>-?\d+)|(?P<star>\*\*?)|(?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"))\]"""
)


def parse_readable(path: str) -> tuple[Segment, ...]:
    """Segments of a readable path; ``ValueError`` naming the position if it is malformed."""
    segments: list[Segment] = []
    pos = 0
    while pos < len(path):
        if path[pos] == "[":
            match = _BRACKET.match(path, pos)
            if match is None:
                raise ValueError(f"bad path {path!r}: unreadable brackets at offset {pos}")
            if match["int"] is not None:
                segments.append(int(match["int"]))
            elif match["star"] is not None:
                segments.append(Wildcard(match["star"]))
            else:
                segments.append(str(ast.literal_eval(match["str"])))
        else:
            if segments:
                if path[pos] != ".":
                    raise ValueError(f"bad path {path!r}: expected '.' or '[' at offset {pos}")
                pos += 1
            match = _BARE.match(path, pos)
            if match is None:
                raise ValueError(f"bad path {path!r}: expected a key at offset {pos}")
            text = match.group()
            segments.append(Wildcard(text) if text in ("*", "**") else text)
        pos = match.end()
    return tuple(segments)


def render_readable(segments: Sequence[object]) -> str:
    """The readable form of path segments, as deepdiff's ``path(output_format='list')`` gives."""
    parts: list[str] = []
    for segment in segments:
        if isinstance(segment, Wildcard):
            parts.append(f"[{segment.value}]")
        elif isinstance(segment, str):
            # A key that looks like a wildcard or holds separators is quoted, so that parsing
            # the rendering gives the same key back.
            if _BARE.fullmatch(segment) and segment not in ("*", "**"):
                parts.append(f".{segment}" if parts else segment)
            else:
                parts.append(f"[{segment!r}]")
        elif isinstance(segment, int) and not isinstance(segment, bool):
            parts.append(f"[{segment}]")
        else:  # keys JSON cannot hold (tuples, floats, None): shown, not meant to be parsed
            parts.append(f"[{segment!r}]")
    return "".join(parts)


def to_deepdiff_path(path: str) -> str:
    """``pages.to_page`` → ``root['pages']['to_page']``; wildcards become deepdiff globs."""
    parts = ["root"]
    for segment in parse_readable(path):
        if isinstance(segment, Wildcard):
            parts.append(f"[{segment.value}]")
        elif isinstance(segment, str):
            # deepdiff's own quoting, so the string equals what its level.path() produces;
            # deepdiff leaves these helpers unannotated.
            quoted = stringify_element(segment, quote_str="'{}'")  # type: ignore[no-untyped-call]
            parts.append(f"[{quoted}]")
        else:
            parts.append(f"[{segment}]")
    return "".join(parts)


@lru_cache(maxsize=8192)
def readable_path(deepdiff_path: str) -> str:
    """``root['a'][0]`` → ``a[0]``; ``root`` → ``""``."""
    segments = parse_path(deepdiff_path)  # type: ignore[no-untyped-call]
    return render_readable(segments)


def is_under(path: str, ancestor: str) -> bool:
    """Whether ``path`` is ``ancestor`` or below it (``a.b`` and ``a[3]`` are under ``a``).

    Rendered paths end on a segment boundary and every segment after the first starts with
    ``.`` or ``[``, so a string prefix test at that boundary is a segment prefix test.
    """
    if not ancestor or path == ancestor:
        return True
    return path.startswith(ancestor) and path[len(ancestor)] in ".["
