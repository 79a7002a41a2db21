"""The comparators on their own: no Redis, no Kafka, just values in and differences out."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest
from deepdiff import DeepDiff

from comparators import (
    Comparator,
    CompareRules,
    DeliveryComparator,
    Difference,
    NoiseBaseline,
    OrderingComparator,
    OrderTracker,
    OutcomeComparator,
    PayloadComparator,
    RoutingComparator,
    RulesError,
    TypeRules,
    canonical_digest,
    canonical_json,
    load_rules,
    outcome_digest,
    parse_entry_id,
    readable_path,
    to_deepdiff_path,
)
from comparators.deepdiff_adapter import deepdiff_options, to_differences
from comparators.error import ErrorComparator
from comparators.paths import is_under, parse_readable, render_readable
from sidecar.verdicts.compare import Comparators
from sidecar.verdicts.model import VerdictRecord

# Per row of comparators/registry.py, pairs that differ in every way it can see: the
# registry's test checks the row lists every kind they report.
REGISTRY_EXAMPLES: dict[str, list[tuple[Any, Any]]] = {
    "payload": [
        (b'{"a": 1, "b": [1, 2], "c": 1}', b'{"a": "1", "b": [1], "d": 1}'),
        (b"{", b"{}"),
    ],
    "outcome": [({"a": 1, "b": [1, 2], "c": 1.5}, {"a": "1", "b": [2, 1, 3], "c": 2.5})],
    "routing": [
        (
            {"task_type": "parse", "priority": 1},
            {"topic": "elsewhere", "priority": 0, "task_type": "raptor"},
        )
    ],
    "ordering": [([("doc", "1-0"), ("doc", "2-0")], [("doc", "2-0"), ("doc", "1-0")])],
    "delivery": [({"deliveries": 2, "latency_ms": 0.0}, {"deliveries": 1, "latency_ms": 99.0})],
    "error": [("ValueError: bad page", None), ("ValueError: x", "TimeoutError: x")],
}


def outcome(**changes: Any) -> dict[str, Any]:
    """A parse outcome as the shadow consumer records it."""
    base: dict[str, Any] = {
        "kind": "parse",
        "decision": "process",
        "task": {
            "id": "5b1f0c2e8a7d11ef9c3a0242ac120006",
            "doc_id": "6c2e1d3f8a7d11ef9c3a0242ac120006",
            "progress": 0.0,
            "progress_msg": "10:15:03 Task has been received.",
            "update_time": 1787379303123,
        },
        "pages": [0, 12],
        "chunks": [{"id": "c1", "tokens": 120}, {"id": "c2", "tokens": 98}],
    }
    base.update(changes)
    return base


def paths(differences: list[Difference]) -> list[str]:
    return [d.path for d in differences]


# --- Difference and paths ---------------------------------------------------------------


def test_difference_to_dict_is_json_safe_and_keeps_json_values() -> None:
    plain = Difference("pages[1]", "value_changed", 12, 13).to_dict()
    assert plain == {"path": "pages[1]", "kind": "value_changed", "left": 12, "right": 13}
    odd = Difference("x", "type_changed", {1, 2}, float("nan")).to_dict()
    assert odd["left"] == "{1, 2}"
    assert odd["right"] == "nan"
    json.dumps(odd, allow_nan=False)  # must not raise


@pytest.mark.parametrize(
    ("path", "top"),
    [
        ("", "(root)"),
        ("pages", "pages"),
        ("pages.to_page", "pages"),
        ("doc_ids[2]", "doc_ids"),
        ("meta['a.b'].c", "meta"),
        ("['a.b'].c", "['a.b']"),
        ("[3].x", "[3]"),
    ],
)
def test_top_level_is_the_first_segment(path: str, top: str) -> None:
    assert Difference(path, "value_changed", 1, 2).top_level == top


@pytest.mark.parametrize(
    ("readable", "deepdiff"),
    [
        ("", "root"),
        ("progress_msg", "root['progress_msg']"),
        ("pages.to_page", "root['pages']['to_page']"),
        ("doc_ids[2]", "root['doc_ids'][2]"),
        ("meta['a.b'][0]", "root['meta']['a.b'][0]"),
        ("chunks[*].ts", "root['chunks'][*]['ts']"),
    ],
)
def test_paths_translate_both_ways(readable: str, deepdiff: str) -> None:
    assert to_deepdiff_path(readable) == deepdiff
    if "*" not in readable:
        assert readable_path(deepdiff) == readable
    assert render_readable(parse_readable(readable)) == readable


def test_keys_that_need_quoting_survive_a_round_trip() -> None:
    for key in ["a.b", "with space", "it's", "*", "[0]", "7"]:
        rendered = render_readable(["top", key, 3])
        assert parse_readable(rendered) == ("top", key, 3), rendered


@pytest.mark.parametrize("bad", ["a..b", "a[", "a[x]", ".a", "a]", "a['b"])
def test_malformed_paths_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="bad path"):
        parse_readable(bad)


def test_is_under_respects_segment_boundaries() -> None:
    assert is_under("a.b", "a")
    assert is_under("a[3]", "a")
    assert is_under("a", "a")
    assert is_under("anything", "")
    assert not is_under("ab", "a")
    assert not is_under("a", "a.b")


def test_every_comparator_satisfies_the_protocol() -> None:
    # The annotation has mypy check the protocol too; isinstance checks it at run time.
    comparators: list[Comparator] = [
        PayloadComparator(),
        OutcomeComparator(),
        RoutingComparator(lambda t, p: t),
        DeliveryComparator(10.0),
        OrderingComparator(),
    ]
    for comparator in comparators:
        assert isinstance(comparator, Comparator)
    names = [c.name for c in comparators]
    assert names == ["payload", "outcome", "routing", "delivery", "ordering"]


# --- error --------------------------------------------------------------------------------


def test_a_failure_on_one_path_only_or_of_another_type_is_an_error_difference() -> None:
    errors = ErrorComparator()
    assert errors.compare(None, "KeyError: 'doc_id'") == [
        Difference("error", "failed", None, "KeyError: 'doc_id'")
    ]
    assert errors.compare("ValueError: bad page 3", "TimeoutError: read") == [
        Difference("error", "error_changed", "ValueError: bad page 3", "TimeoutError: read")
    ]
    # The message carries run-to-run noise (ids, times): the same type is the same failure.
    assert errors.compare("ValueError: bad page 3", "ValueError: bad page 4") == []
    assert errors.compare(None, None) == []


def _runs_failing_with(redis_error: str, kafka_error: str) -> tuple[dict[str, Any], ...]:
    common = {"value_sha": "a", "outcome": None, "topic": "t", "priority": 0, "task_type": "parse"}
    return {**common, "error": redis_error}, {**common, "error": kafka_error}


def test_the_judge_tells_a_task_failing_differently_on_each_path_a_mismatch() -> None:
    # A failed run has no outcome: before the error row, two failures of any cause matched.
    redis_run, kafka_run = _runs_failing_with("ValueError: bad page", "TimeoutError: read")
    record = VerdictRecord("mismatch", "te.0.common", "1-0", "t1", "parse", 0, "sidecar")
    found = Comparators(CompareRules(), 10.0).differences(redis_run, kafka_run, {}, record)
    assert found == [
        Difference("error", "error_changed", "ValueError: bad page", "TimeoutError: read")
    ]
    assert record.comparators["error"] == 1
    same, _ = _runs_failing_with("ValueError: bad page 3", "ValueError: bad page 4")
    assert Comparators(CompareRules(), 10.0).differences(same, same, {}, record) == []


# --- payload ------------------------------------------------------------------------------


TASK = {"id": "t1", "doc_id": "d1", "from_page": 0, "to_page": 12, "note": 'Grüße "x"'}


def test_payload_identical_bytes_match() -> None:
    raw = json.dumps(TASK).encode()
    assert PayloadComparator().compare(raw, raw) == []


def test_payload_equal_json_in_other_bytes_matches() -> None:
    # RAGFlow writes ASCII escapes; a copy re-encoded as UTF-8 with other key order is the same.
    left = json.dumps(TASK).encode()
    right = json.dumps(dict(reversed(TASK.items())), ensure_ascii=False).encode()
    assert left != right
    assert PayloadComparator().compare(left, right) == []
    assert PayloadComparator().compare(left, TASK) == []


def test_payload_difference_names_the_field() -> None:
    left = json.dumps(TASK).encode()
    right = json.dumps({**TASK, "to_page": 13}).encode()
    assert PayloadComparator().compare(left, right) == [
        Difference("to_page", "value_changed", 12, 13)
    ]


def test_payload_added_and_removed_keys() -> None:
    right = {k: v for k, v in TASK.items() if k != "note"} | {"task_type": "raptor"}
    differences = PayloadComparator().compare(TASK, right)
    assert [(d.path, d.kind) for d in differences] == [("note", "removed"), ("task_type", "added")]
    assert differences[0].left == TASK["note"]
    assert differences[1].right == "raptor"


@pytest.mark.parametrize("garbage", [b"\xff\xfe not json", b'{"id": ', b""])
def test_payload_that_is_not_json_is_undecodable(garbage: bytes) -> None:
    good = json.dumps(TASK).encode()
    for left, right in [(garbage, good), (good, garbage)]:
        assert PayloadComparator().compare(left, right) == [
            Difference("", "undecodable", left, right)
        ]


def test_payload_rules_apply() -> None:
    rules = TypeRules(exclude_paths=("note",))
    assert PayloadComparator(rules).compare(TASK, {**TASK, "note": "other"}) == []
    assert paths(PayloadComparator().compare(TASK, {**TASK, "note": "other"})) == ["note"]


# --- outcome ------------------------------------------------------------------------------


def test_outcome_equal_whatever_the_key_order() -> None:
    left = outcome()
    right = json.loads(json.dumps(dict(reversed(left.items()))))
    assert OutcomeComparator().compare(left, right) == []


def test_outcome_difference_names_nested_field_and_list_index() -> None:
    right = outcome(pages=[0, 13])
    right["task"]["doc_id"] = "other"
    differences = OutcomeComparator().compare(outcome(), right)
    assert differences == [
        Difference("pages[1]", "value_changed", 12, 13),
        Difference("task.doc_id", "value_changed", "6c2e1d3f8a7d11ef9c3a0242ac120006", "other"),
    ]
    assert {d.top_level for d in differences} == {"pages", "task"}


def test_outcome_reports_the_field_even_when_few_keys_are_shared() -> None:
    # deepdiff by default would call the whole dict changed; the field must be named.
    differences = OutcomeComparator().compare({"a": {"x": 1}}, {"a": {"y": 1}})
    assert [(d.path, d.kind) for d in differences] == [("a.x", "removed"), ("a.y", "added")]


def test_outcome_type_change_and_root_change() -> None:
    assert OutcomeComparator().compare({"n": 1}, {"n": "1"}) == [
        Difference("n", "type_changed", 1, "1")
    ]
    root = OutcomeComparator().compare({"n": 1}, [1])
    assert [(d.path, d.kind) for d in root] == [("", "type_changed")]


def test_outcome_int_and_float_differ_unless_rules_say_otherwise() -> None:
    left, right = outcome(pages=[0, 12]), outcome(pages=[0, 12.0])
    assert OutcomeComparator().compare(left, right) == [
        Difference("pages[1]", "type_changed", 12, 12.0)
    ]
    lenient = CompareRules(TypeRules(ignore_numeric_type_changes=True))
    assert OutcomeComparator(lenient).compare(left, right) == []
    # Lenient about the type, not the value.
    assert paths(OutcomeComparator(lenient).compare(left, outcome(pages=[0, 12.5]))) == ["pages[1]"]


def test_outcome_list_items_keep_their_types() -> None:
    # deepdiff's default alignment of scalar lists would take these for equal.
    assert OutcomeComparator().compare({"flags": [0, 1]}, {"flags": [0, True]}) == [
        Difference("flags[1]", "type_changed", 1, True)
    ]
    assert [(d.path, d.kind) for d in OutcomeComparator().compare([1, 2], [1, 2, 3])] == [
        ("[2]", "added")
    ]


def test_outcome_mismatch_reports_whole_added_values_and_exact_leaves() -> None:
    left = {"a": {"x": 1, "y": {"z": [1, 2]}}, "b": 2, "c": {"same": True}}
    right = {"a": {"x": 1, "y": {"z": [1, 3]}, "n": {"k": 1}}, "b": 2, "c": {"same": True}}
    assert OutcomeComparator().compare(left, right) == [
        Difference("a.n", "added", None, {"k": 1}),
        Difference("a.y.z[1]", "value_changed", 2, 3),
    ]


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"a": {"n": 1, "k": "v"}}, {"a": {"n": 1.0, "k": "v"}}),
        ({"a": {"n": 1, "k": "v"}}, {"a": {"n": True, "k": "v"}}),
        ({"a": {"s": {1}, "k": "v"}}, {"a": {"s": {True}, "k": "v"}}),
        # The set keeps canonical JSON from taking the pair for equal first.
        ({"a": {"t": (1, 2), "k": "v"}, "z": {0}}, {"a": {"t": [1, 2], "k": "v"}, "z": {0}}),
        ({"a": {"l": [{"x": 1}], "k": "v"}}, {"a": {"l": [{"x": 1.0}], "k": "v"}}),
        ({"a": {"d": {"x": 1}}, "b": 1}, {"a": {"d": {"x": 1}, "e": None}, "b": 1}),
    ],
)
def test_pruning_equal_parts_never_hides_a_difference(left: Any, right: Any) -> None:
    # Equal subtrees are dropped before deepdiff runs; the result must be as without that.
    full = to_differences(DeepDiff(left, right, **deepdiff_options(None)))
    assert full != []
    assert OutcomeComparator().compare(left, right) == full


def test_outcome_significant_digits() -> None:
    left, right = {"score": 0.12341}, {"score": 0.12349}
    assert paths(OutcomeComparator().compare(left, right)) == ["score"]
    assert (
        OutcomeComparator(CompareRules(TypeRules(significant_digits=3))).compare(left, right) == []
    )
    assert paths(
        OutcomeComparator(CompareRules(TypeRules(significant_digits=5))).compare(left, right)
    ) == ["score"]


def test_outcome_ignore_order() -> None:
    left = outcome()
    right = outcome(chunks=list(reversed(left["chunks"])))
    assert OutcomeComparator().compare(left, right) != []
    assert OutcomeComparator(CompareRules(TypeRules(ignore_order=True))).compare(left, right) == []


def test_outcome_compare_with_digests_matches_outcome_digest() -> None:
    comparator = OutcomeComparator()
    same = comparator.compare_with_digests(outcome(), copy.deepcopy(outcome()))
    assert same.equal
    assert same.identical
    assert same.left_digest == same.right_digest == outcome_digest(outcome())
    assert canonical_digest(outcome()) == (canonical_json(outcome()), outcome_digest(outcome()))

    other = comparator.compare_with_digests(outcome(), outcome(decision="skip"))
    assert not other.equal
    assert not other.identical
    assert other.right_digest == outcome_digest(outcome(decision="skip"))
    assert [d.path for d in other.differences] == ["decision"]


def test_outcome_equal_under_rules_is_not_identical() -> None:
    rules = CompareRules(TypeRules(exclude_paths=("task.progress_msg",)))
    right = outcome()
    right["task"]["progress_msg"] = "later"
    result = OutcomeComparator(rules).compare_with_digests(outcome(), right)
    assert result.equal
    assert not result.identical


def test_outcome_of_non_json_values_still_compares() -> None:
    assert OutcomeComparator().compare({"x": {1, 2}}, {"x": {1, 2}}) == []
    assert OutcomeComparator().compare({"x": {1, 2}}, {"x": {1, 3}}) == [
        Difference("x", "added", None, 3),
        Difference("x", "removed", 2, None),
    ]
    with pytest.raises(TypeError):
        OutcomeComparator().compare_with_digests({"x": {1}}, {"x": {1}})


def test_outcome_equality_is_that_of_json() -> None:
    assert OutcomeComparator().compare({"t": (1, 2)}, {"t": [1, 2]}) == []


def test_outcome_keys_starting_with_underscores_are_compared() -> None:
    assert paths(OutcomeComparator().compare({"__meta": 1}, {"__meta": 2})) == ["__meta"]


# --- rules from files ---------------------------------------------------------------------

YAML_RULES = r"""
default:
  exclude_paths: [task.progress_msg]
  exclude_regex_paths: ['(^|\.)update_(time|date)$']
task_types:
  memory:
    exclude_paths: [task.message_dict]
    ignore_order: true
  parse:
    significant_digits: 2
    ignore_numeric_type_changes: true
"""

TOML_RULES = r"""
[default]
exclude_paths = ["task.progress_msg"]
exclude_regex_paths = ['(^|\.)update_(time|date)$']

[task_types.memory]
exclude_paths = ["task.message_dict"]
ignore_order = true

[task_types.parse]
significant_digits = 2
ignore_numeric_type_changes = true
"""


@pytest.fixture(
    params=[("rules.yaml", YAML_RULES), ("rules.yml", YAML_RULES), ("rules.toml", TOML_RULES)]
)
def rules_file(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    name, text = request.param
    path: Path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_rules_file_is_read_and_merged(rules_file: Path) -> None:
    rules = load_rules(rules_file)
    assert rules.default.exclude_paths == ("task.progress_msg",)
    memory = rules.for_task_type("memory")
    # Lists are appended to the default's, scalars replace it.
    assert memory.exclude_paths == ("task.progress_msg", "task.message_dict")
    assert memory.exclude_regex_paths == rules.default.exclude_regex_paths
    assert memory.ignore_order is True
    assert memory.significant_digits is None
    assert rules.for_task_type("parse").significant_digits == 2
    assert rules.for_task_type("dataflow") == rules.default
    assert rules == CompareRules.from_mapping(
        {
            "default": {
                "exclude_paths": ["task.progress_msg"],
                "exclude_regex_paths": [r"(^|\.)update_(time|date)$"],
            },
            "task_types": {
                "memory": {"exclude_paths": ["task.message_dict"], "ignore_order": True},
                "parse": {"significant_digits": 2, "ignore_numeric_type_changes": True},
            },
        }
    )


def test_rules_file_silences_excluded_path_and_regex(rules_file: Path) -> None:
    comparator = OutcomeComparator(load_rules(rules_file))
    right = outcome()
    right["task"]["progress_msg"] = "10:15:09 Page(1~13): OCR finished"  # excluded path
    right["task"]["update_time"] = 1787379309999  # excluded by the regex
    assert comparator.compare(outcome(), right, "dataflow") == []
    right["task"]["doc_id"] = "changed"
    assert paths(comparator.compare(outcome(), right, "dataflow")) == ["task.doc_id"]
    # Without rules, all three count.
    assert paths(OutcomeComparator().compare(outcome(), right)) == [
        "task.doc_id",
        "task.progress_msg",
        "task.update_time",
    ]


def test_rules_file_per_type_options(rules_file: Path) -> None:
    comparator = OutcomeComparator(load_rules(rules_file))
    left, right = {"score": 1, "chunks": [1, 2]}, {"score": 1.004, "chunks": [2, 1]}
    # parse: 2 significant digits and int == float, but order still counts.
    assert paths(comparator.compare(left, right, "parse")) == ["chunks[0]", "chunks[1]"]
    # memory: order ignored, but the score is compared exactly.
    assert [(d.path, d.kind) for d in comparator.compare(left, right, "memory")] == [
        ("score", "type_changed")
    ]
    assert comparator.compare(left, {"score": 1.0, "chunks": [1, 2]}, "parse") == []


def test_regex_rules_match_readable_paths_inside_unordered_lists() -> None:
    rules = CompareRules(
        TypeRules(exclude_regex_paths=(r"^chunks\[\d+\]\.ts$",), ignore_order=True)
    )
    left = {"chunks": [{"id": 1, "ts": 10}, {"id": 2, "ts": 11}]}
    right = {"chunks": [{"id": 2, "ts": 99}, {"id": 1, "ts": 98}]}
    assert OutcomeComparator(rules).compare(left, right) == []
    right["chunks"][0]["id"] = 3
    assert OutcomeComparator(rules).compare(left, right) != []


def test_wildcard_exclude_paths() -> None:
    rules = CompareRules(TypeRules(exclude_paths=("chunks[*].ts",)))
    left = {"chunks": [{"id": 1, "ts": 10}], "ts": 1}
    right = {"chunks": [{"id": 1, "ts": 20}], "ts": 2}
    assert paths(OutcomeComparator(rules).compare(left, right)) == ["ts"]


def test_empty_yaml_file_gives_default_rules(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("", encoding="utf-8")
    assert load_rules(path) == CompareRules()


@pytest.mark.parametrize(
    ("name", "text", "key"),
    [
        ("r.yaml", "defaults: {}\n", "defaults"),
        ("r.yaml", "default:\n  exclude_path: [a]\n", "default.exclude_path"),
        ("r.yaml", "default:\n  ignore_order: 'yes'\n", "default.ignore_order"),
        ("r.yaml", "default:\n  exclude_paths: task.progress_msg\n", "default.exclude_paths"),
        ("r.yaml", "default:\n  exclude_paths: [a, 3]\n", "default.exclude_paths[1]"),
        ("r.yaml", "default:\n  exclude_paths: ['a..b']\n", "default.exclude_paths[0]"),
        ("r.yaml", "default:\n  exclude_regex_paths: ['(unclosed']\n", "default.exclude_regex_paths[0]"),
        ("r.yaml", "default:\n  significant_digits: -1\n", "default.significant_digits"),
        ("r.yaml", "default:\n  significant_digits: 2.5\n", "default.significant_digits"),
        ("r.yaml", "default: [a]\n", "default"),
        ("r.yaml", "task_types: [parse]\n", "task_types"),
        ("r.yaml", "task_types:\n  memory:\n    ignore_order: 1\n", "task_types.memory.ignore_order"),
        ("r.yaml", "task_types:\n  memory:\n    exclude_regex_paths: ['[']\n", "task_types.memory.exclude_regex_paths[0]"),
        ("r.yaml", "- just\n- a list\n", "(top level)"),
        ("r.toml", "[default]\nignore_order = \"no\"\n", "default.ignore_order"),
        ("r.toml", "[task_types.parse]\nexclude_pathz = []\n", "task_types.parse.exclude_pathz"),
    ],
)  # fmt: skip
def test_bad_rules_name_file_and_key(tmp_path: Path, name: str, text: str, key: str) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RulesError) as caught:
        load_rules(path)
    message = str(caught.value)
    assert str(path) in message
    assert f": {key}: " in message, message
    assert caught.value.key == key


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("r.json", "{}", "unknown extension"),
        ("r.yaml", "default: [unclosed\n", "not valid YAML"),
        ("r.toml", "[default\n", "not valid TOML"),
        ("r.yaml", None, "cannot read"),
    ],
)
def test_unusable_rules_files(tmp_path: Path, name: str, text: str | None, problem: str) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(RulesError, match=problem) as caught:
        load_rules(path)
    assert str(path) in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_rules_from_mapping_names_its_source() -> None:
    with pytest.raises(RulesError, match=r"^settings: default\.ignore_order: "):
        CompareRules.from_mapping({"default": {"ignore_order": "no"}}, source="settings")


def test_type_rules_check_themselves() -> None:
    with pytest.raises(RulesError, match=r"exclude_regex_paths\[0\]"):
        TypeRules(exclude_regex_paths=("(",))
    with pytest.raises(RulesError, match=r"exclude_paths\[1\]"):
        TypeRules(exclude_paths=("ok", "not..ok"))
    assert TypeRules(exclude_paths=("pages.to_page",)).deepdiff_exclude_paths == (
        "root['pages']['to_page']",
    )


# --- noise baseline -----------------------------------------------------------------------


def redis_run(finished_at: str, trace_id: str) -> dict[str, Any]:
    return outcome(finished_at=finished_at, trace=[{"trace_id": trace_id, "span": "parse"}])


def test_noise_baseline_separates_timestamps_and_random_ids() -> None:
    runs = [
        redis_run("2026-08-22 10:15:03.101", "a1f0"),
        redis_run("2026-08-22 10:15:03.487", "9c2e"),
        redis_run("2026-08-22 10:15:04.002", "77b1"),
    ]
    baseline = NoiseBaseline.from_runs(runs)
    assert baseline.paths == {"finished_at", "trace[0].trace_id"}

    kafka_run = redis_run("2026-08-22 10:16:00.000", "0000")
    kafka_run["pages"] = [0, 11]
    differences = OutcomeComparator().compare(runs[0], kafka_run)
    assert len(differences) == 3
    real, noise = baseline.split(differences)
    assert paths(real) == ["pages[1]"]
    assert sorted(paths(noise)) == ["finished_at", "trace[0].trace_id"]


def test_noise_below_a_noisy_path_is_noise() -> None:
    baseline = NoiseBaseline(frozenset({"meta", "chunks[0]"}))
    real, noise = baseline.split(
        [
            Difference("meta.host", "value_changed", "a", "b"),
            Difference("meta[2]", "added", None, 1),
            Difference("chunks[0].id", "value_changed", 1, 2),
            Difference("chunks[1].id", "value_changed", 1, 2),
            Difference("metadata", "value_changed", 1, 2),
        ]
    )
    assert paths(noise) == ["meta.host", "meta[2]", "chunks[0].id"]
    assert paths(real) == ["chunks[1].id", "metadata"]


def test_with_one_run_nothing_is_noise() -> None:
    baseline = NoiseBaseline.from_runs([redis_run("t", "x")])
    assert baseline.paths == frozenset()
    difference = Difference("finished_at", "value_changed", "t", "u")
    assert baseline.split([difference]) == ([difference], [])


def test_noise_baseline_uses_the_rules() -> None:
    runs = [{"ts": 1, "n": 1}, {"ts": 2, "n": 1}, {"ts": 3, "n": 2}]
    assert NoiseBaseline.from_runs(runs).paths == {"ts", "n"}
    assert NoiseBaseline.from_runs(runs, TypeRules(exclude_paths=("ts",))).paths == {"n"}


# --- routing ------------------------------------------------------------------------------


def expected_topic(task_type: str, priority: int) -> str:
    return f"ragflow.tasks.p{priority}" if task_type != "memory" else "ragflow.memory"


def test_routing_match() -> None:
    redis = {"stream": "te.0.common", "priority": 0, "task_type": "parse"}
    kafka = {"topic": "ragflow.tasks.p0", "priority": 0, "task_type": "parse"}
    assert RoutingComparator(expected_topic).compare(redis, kafka) == []


def test_routing_mismatches() -> None:
    comparator = RoutingComparator(expected_topic)
    redis = {"stream": "te.1.common", "priority": 1, "task_type": "memory"}
    assert comparator.compare(
        redis, {"topic": "ragflow.tasks.p1", "priority": 1, "task_type": "memory"}
    ) == [Difference("topic", "routing", "ragflow.memory", "ragflow.tasks.p1")]
    assert comparator.compare(
        redis, {"topic": "ragflow.memory", "priority": 0, "task_type": "memory"}
    ) == [Difference("priority", "routing", 1, 0)]
    assert comparator.compare(
        redis, {"topic": "ragflow.memory", "priority": 1, "task_type": "raptor"}
    ) == [Difference("task_type", "routing", "memory", "raptor")]


def test_routing_without_redis_facts_cannot_match() -> None:
    differences = RoutingComparator(expected_topic).compare(
        {"stream": "te.0.common"}, {"topic": "ragflow.tasks.p0", "priority": 0, "task_type": "x"}
    )
    assert paths(differences) == ["topic", "priority", "task_type"]


# --- delivery -----------------------------------------------------------------------------


def test_delivery_clean() -> None:
    comparator = DeliveryComparator(latency_tolerance_ms=50)
    assert (
        comparator.compare(
            {"deliveries": 1, "latency_ms": 12.0}, {"deliveries": 1, "latency_ms": 61.0}
        )
        == []
    )
    assert (
        comparator.compare(
            {"deliveries": 1, "latency_ms": None}, {"deliveries": 1, "latency_ms": 900.0}
        )
        == []
    )


def test_delivery_duplicates_name_the_side() -> None:
    comparator = DeliveryComparator(latency_tolerance_ms=50)
    kafka_dup = comparator.compare(
        {"deliveries": 1, "latency_ms": None}, {"deliveries": 2, "latency_ms": None}
    )
    assert kafka_dup == [Difference("kafka.deliveries", "duplicate", 1, 2)]
    both = comparator.compare(
        {"deliveries": 3, "latency_ms": None}, {"deliveries": 2, "latency_ms": None}
    )
    assert paths(both) == ["redis.deliveries", "kafka.deliveries"]
    assert {d.kind for d in both} == {"duplicate"}


def test_delivery_latency_beyond_tolerance() -> None:
    comparator = DeliveryComparator(latency_tolerance_ms=50)
    assert comparator.compare(
        {"deliveries": 1, "latency_ms": 10.0}, {"deliveries": 1, "latency_ms": 60.5}
    ) == [Difference("latency_ms", "latency", 10.0, 60.5)]
    with pytest.raises(ValueError):
        DeliveryComparator(latency_tolerance_ms=-1)


# --- ordering -----------------------------------------------------------------------------


def test_entry_ids_compare_numerically() -> None:
    assert parse_entry_id("9-0") < parse_entry_id("10-0")  # "9-0" > "10-0" as strings
    assert parse_entry_id("1787379303123-2") == (1787379303123, 2)
    for bad in ["", "12", "a-1", "1-2-3", "-1-0"]:
        with pytest.raises(ValueError):
            parse_entry_id(bad)


def test_ordering_in_order_is_clean() -> None:
    redis = [("doc1", "1-0"), ("doc2", "2-0"), ("doc1", "3-0"), ("doc2", "4-0")]
    # Different keys may interleave differently (other partitions); one key's order holds.
    kafka = [("doc2", "2-0"), ("doc2", "4-0"), ("doc1", "1-0"), ("doc1", "3-0")]
    assert OrderingComparator().compare(redis, kafka) == []


def test_ordering_inversion_is_reported_per_key() -> None:
    redis = [("doc1", "1-0"), ("doc1", "2-0"), ("doc2", "3-0"), ("doc1", "10-0"), ("doc2", "11-0")]
    kafka = [("doc1", "10-0"), ("doc2", "3-0"), ("doc1", "1-0"), ("doc2", "11-0"), ("doc1", "2-0")]
    assert OrderingComparator().compare(redis, kafka) == [
        Difference("doc1", "order", "1-0", "10-0"),
        Difference("doc1", "order", "2-0", "10-0"),
    ]


def test_ordering_ignores_entries_of_one_side_and_repeats() -> None:
    redis = [("k", "1-0"), ("k", "2-0"), ("k", "3-0")]
    kafka = [("k", "1-0"), ("k", "2-0"), ("k", "2-0"), ("k", "5-0"), ("k", "3-0")]
    assert OrderingComparator().compare(redis, kafka) == []


def test_order_tracker_flags_late_entries() -> None:
    tracker = OrderTracker()
    assert tracker.observe("doc1", "9-0") is None
    assert tracker.observe("doc1", "10-0") is None  # numerically later, not lexically
    assert tracker.observe("doc2", "1-0") is None  # other keys are independent
    assert tracker.observe("doc1", "10-0") is None  # a redelivery, not an inversion
    assert tracker.observe("doc1", "9-5") == Difference("doc1", "order", "9-5", "10-0")
    assert tracker.observe("doc1", "10-1") is None
    assert tracker.observe("doc1", "9-7") == Difference("doc1", "order", "9-7", "10-1")
    assert len(tracker) == 2


def test_a_record_written_twice_is_never_an_order_mismatch() -> None:
    # Kafka's log after an outage: the mirror sent a batch (e1..e3) that Kafka wrote but did
    # not confirm, then re-sent it whole once the broker was back, and went on (e4, e5). A
    # consumer that restarts from its last commit reads some of it a third time.
    tracker = OrderTracker()
    first = ["1-0", "1-1", "2-0"]
    log = [*first, *first, "3-0", "4-0", "1-1", "2-0", "3-0"]
    assert [tracker.observe("doc1", entry_id) for entry_id in log] == [None] * len(log)
    # Only the unconfirmed tail re-sent (what a retry of the failed records sends).
    assert tracker.observe("doc2", "1-0") is None
    assert tracker.observe("doc2", "2-0") is None
    assert tracker.observe("doc2", "2-5") is None
    assert tracker.observe("doc2", "2-0") is None
    # A real reordering still is one, and so is each copy of the late entry.
    assert tracker.observe("doc1", "4-2") is None
    assert tracker.observe("doc1", "5-0") is None
    late = Difference("doc1", "order", "4-5", "5-0")
    assert tracker.observe("doc1", "4-5") == late
    assert tracker.observe("doc1", "6-0") is None
    assert tracker.observe("doc1", "4-5") == late  # its re-sent copy: the same verdict


def test_copies_past_the_remembered_entries_get_no_verdict() -> None:
    # The entries remembered below each key's latest are bounded: beyond them a copy cannot
    # be told from a late entry, and nothing is said rather than a false order.
    tracker = OrderTracker(max_ids=2)
    for entry_id in ("1-0", "2-0", "3-0", "4-0"):
        assert tracker.observe("k", entry_id) is None
    assert tracker.observe("k", "1-0") is None  # forgotten: 1-0 left the FIFO
    assert tracker.observe("k", "0-5") is None  # below the forgotten: not judged
    assert tracker.observe("k", "1-5") == Difference("k", "order", "1-5", "4-0")  # above: late
    assert tracker.observe("k", "3-0") is None  # remembered: a copy
    assert tracker.observe("k", "3-5") == Difference("k", "order", "3-5", "4-0")
    with pytest.raises(ValueError):
        OrderTracker(max_ids=0)


def test_the_streaming_order_check_finds_what_the_whole_sequences_show() -> None:
    # The live path judges order with OrderTracker as the shadow consumes; OrderingComparator,
    # over both whole sequences, is the rule it must agree with (comparators/registry.py).
    rng = random.Random(32)
    for _ in range(200):
        redis = [(f"k{rng.randrange(3)}", f"{n}-{rng.randrange(2)}") for n in range(1, 12)]
        kafka = rng.sample(redis, len(redis))
        # Copies too, as a re-send or a redelivery writes them: anywhere after the first.
        for _ in range(rng.randrange(4)):
            at = rng.randrange(len(kafka))
            kafka.insert(rng.randrange(at + 1, len(kafka) + 1), kafka[at])
        tracker = OrderTracker()
        streamed = [tracker.observe(key, entry_id) for key, entry_id in kafka]
        first_copies = [d for n, d in enumerate(streamed) if d and kafka[n] not in kafka[:n]]
        assert first_copies == OrderingComparator().compare(redis, kafka)


def test_order_tracker_is_bounded_and_least_recently_used() -> None:
    tracker = OrderTracker(max_keys=2)
    tracker.observe("a", "5-0")
    tracker.observe("b", "5-0")
    tracker.observe("a", "6-0")  # "a" is now the most recently used
    tracker.observe("c", "5-0")  # evicts "b"
    assert len(tracker) == 2
    assert tracker.observe("a", "1-0") is not None  # "a" was kept
    assert tracker.observe("b", "1-0") is None  # "b" was forgotten
    with pytest.raises(ValueError):
        OrderTracker(max_keys=0)
