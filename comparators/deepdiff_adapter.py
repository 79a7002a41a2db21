"""The one place deepdiff is called: rules become its options, its tree becomes Differences."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from deepdiff import DeepDiff
from deepdiff.helper import notpresent

from comparators.base import Difference
from comparators.paths import readable_path, render_readable
from comparators.rules import TypeRules

# deepdiff's report types, folded into the few kinds a verdict record or a metric needs.
_KINDS: Final = {
    "values_changed": "value_changed",
    "type_changes": "type_changed",
    "dictionary_item_added": "added",
    "iterable_item_added": "added",
    "attribute_added": "added",
    "set_item_added": "added",
    "dictionary_item_removed": "removed",
    "iterable_item_removed": "removed",
    "attribute_removed": "removed",
    "set_item_removed": "removed",
    "repetition_change": "repetition_changed",
    "iterable_item_moved": "moved",
}
# The kinds those fold into, for the comparator registry (a report type deepdiff adds later
# passes under its own name until it is folded in here).
DIFFERENCE_KINDS: Final = tuple(dict.fromkeys(_KINDS.values()))


def _regex_filter(rules: TypeRules) -> Callable[[Any, str], bool]:
    regexes = rules.regexes

    # Rules' regular expressions are written against readable paths, which deepdiff's
    # exclude_regex_paths (matching its own root['a'] strings) cannot do; a callback also
    # reaches the hashing ignore_order does, so excluded fields do not split list items.
    def excluded(_obj: Any, path: str) -> bool:
        readable = readable_path(path)
        return any(regex.search(readable) for regex in regexes)

    return excluded


def deepdiff_options(rules: TypeRules | None) -> dict[str, Any]:
    """Keyword arguments for ``DeepDiff`` under ``rules`` (``None``: exact comparison)."""
    options: dict[str, Any] = {
        "view": "tree",
        "verbose_level": 2,
        # By default deepdiff reports a whole dict as changed when few keys are shared;
        # a verdict must name the field.
        "threshold_to_diff_deeper": 0,
        # By default keys starting with "__" are skipped; payload keys are data.
        "ignore_private_variables": False,
        # By default lists of scalars are aligned with difflib, which holds 12 == 12.0 and
        # 1 == True and so misses those changes; pairing by position misses nothing, at the
        # price of naming every shifted index after an insertion.
        "zip_ordered_iterables": True,
    }
    if rules is None:
        return options
    options.update(
        ignore_order=rules.ignore_order,
        ignore_numeric_type_changes=rules.ignore_numeric_type_changes,
        significant_digits=rules.significant_digits,
    )
    if rules.deepdiff_exclude_paths:
        options["exclude_paths"] = list(rules.deepdiff_exclude_paths)
    if rules.regexes:
        options["exclude_obj_callback"] = _regex_filter(rules)
    return options


def _value(value: Any) -> Any:
    return None if value is notpresent else value


def _path_of(level: Any, report_type: str) -> str:
    segments = level.path(output_format="list")
    if segments is None:  # deepdiff found no path; its "fake" form still says where
        return str(level.path(force="fake"))
    if report_type.startswith("set_item_") and segments and segments[-1] is None:
        # Set members have no index: the set itself is where the difference is.
        segments = segments[:-1]
    return render_readable(segments)


def to_differences(tree: Any) -> list[Difference]:
    """Differences from a tree-view ``DeepDiff`` result, ordered by path for stable output."""
    differences = []
    for report_type, levels in tree.items():
        kind = _KINDS.get(report_type, report_type)
        for level in levels:
            if not hasattr(level, "path"):  # e.g. "unprocessed" holds plain strings
                differences.append(Difference("", kind, None, level))
                continue
            differences.append(
                Difference(_path_of(level, report_type), kind, _value(level.t1), _value(level.t2))
            )
    differences.sort(key=lambda difference: (difference.path, difference.kind))
    return differences


_SCALARS: Final = (str, int, float, bool, type(None))


def _same(left: Any, right: Any) -> bool:
    """Equal with equal types all the way down (``==`` alone holds 1 == 1.0 == True)."""
    kind = type(left)
    if kind is not type(right):
        return False
    if kind is dict:
        return left.keys() == right.keys() and all(_same(v, right[k]) for k, v in left.items())
    if kind is list or kind is tuple:
        return len(left) == len(right) and all(map(_same, left, right))
    # Anything else (sets, objects) is left for deepdiff to judge.
    return kind in _SCALARS and bool(left == right)


def _prune(left: Any, right: Any) -> tuple[Any, Any]:
    """Both dicts without the keys whose values are the same on both sides, recursively.

    deepdiff costs tens of microseconds per node it visits, equal or not; a mismatch is
    usually one field, so dropping the equal rest makes it several times faster. Equal
    values are equal under any rules, and keys are kept, so paths stay as they were.
    Lists are kept whole: their indices are paths and ignore_order pairs their items.
    """
    if type(left) is not dict or type(right) is not dict:
        return left, right
    pruned_left: dict[Any, Any] = {}
    pruned_right: dict[Any, Any] = {}
    for key, value in left.items():
        if key not in right:
            pruned_left[key] = value
        elif not _same(value, right[key]):
            pruned_left[key], pruned_right[key] = _prune(value, right[key])
    for key, other in right.items():
        if key not in left:
            pruned_right[key] = other
    return pruned_left, pruned_right


def deepdiff_differences(left: Any, right: Any, rules: TypeRules | None = None) -> list[Difference]:
    """Run deepdiff on two values under ``rules`` and return readable Differences."""
    left, right = _prune(left, right)
    return to_differences(DeepDiff(left, right, **deepdiff_options(rules)))
