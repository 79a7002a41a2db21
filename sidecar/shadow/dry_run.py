"""The ``ragflow`` handler: what RAGFlow's task executor would decide for a message, dry.

:func:`ragflow_dry_run` follows ``collect()`` in RAGFlow's rag/svr/task_executor.py and the
fields the handlers after it need; the checks here only read the message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from sidecar.config import task_kinds as kinds
from sidecar.shadow.meta import TaskMeta

# The keys RAGFlow's memory producer puts in ``message_dict``. Only these names are ever
# reported: the values are users' chat text, and other keys could be anything.
MESSAGE_DICT_KEYS = frozenset({"user_id", "agent_id", "session_id", "user_input", "agent_response"})
# ``save_extracted_to_memory_only`` indexes these two; the others are read with ``.get``.
MESSAGE_DICT_REQUIRED = ("agent_id", "session_id")

Decision = Literal["process", "cancelled", "reject"]
# What RAGFlow's ``collect()`` does with the message: hands the task on, acks it early (empty
# message, no task row found, cancelled), or raises before acking, which leaves the entry
# pending for only a consumer of the same name to replay.
CollectEffect = Literal["returns_task", "acks_empty", "acks_unknown", "acks_cancelled", "raises"]


def ragflow_dry_run(task: dict[str, Any], meta: TaskMeta) -> dict[str, Any]:
    """What RAGFlow's executor would decide for this message, without any side effect.

    Mirrors ``collect()`` in RAGFlow's rag/svr/task_executor.py (which branch looks the task
    up, what it indexes and so would raise on, when it acks early) and the fields the handlers
    after it need. The message stands in for the Task row that ``TaskService.get_task`` would
    read, which RAGFlow writes from the same dict; the row is assumed to exist and to be under
    its retry limit, as nothing here may read the database. Only ``meta.cancelled`` is used
    from ``meta``, so both paths give the same outcome for the same message.
    """
    if not task:
        # collect() logs "empty message" and acks before looking anything up.
        return _outcome(
            "unknown",
            task_type="",
            decision="reject",
            collect="acks_empty",
            problems={"empty"},
            fields={"id": None},
        )
    problems: set[str] = set()
    raw_type = task.get("task_type", "")  # collect() reads it with a "" default, as here
    task_type = raw_type if isinstance(raw_type, str) else None
    doc_id = task.get("doc_id", "")
    fake_doc = isinstance(doc_id, str) and doc_id in (kinds.FAKE_DOC_ID, kinds.CANVAS_DEBUG_DOC_ID)

    _check_str(task, "id", problems)
    if task_type is None:
        problems.add("type:task_type")
    row = _row(task_type, fake_doc, problems)
    kind: kinds.TaskKind = "unknown" if row is None else row.kind

    fields: dict[str, Any] = {"id": _str_or_none(task.get("id"))}
    if row is None:
        fields["doc_id"] = _str_or_none(doc_id)
    else:
        fields.update(CHECKS[row.check](task, problems))

    lookup = _collect_lookup(task, raw_type, fake_doc)
    collect: CollectEffect
    if lookup != "found":
        collect = lookup
    elif meta.cancelled:
        # The cancel check comes right after the lookup, before the fields that may raise.
        collect = "acks_cancelled"
    elif _collect_tail_raises(task, raw_type):
        collect = "raises"
    else:
        collect = "returns_task"

    decision: Decision
    if collect == "acks_cancelled":
        decision = "cancelled"
    elif collect == "returns_task" and not problems:
        decision = "process"
    else:
        decision = "reject"
        if not problems:  # every early exit above has a code; this is a safety net
            problems.add(f"collect:{collect}")
    return _outcome(
        kind,
        task_type=task_type,
        decision=decision,
        collect=collect,
        problems=problems,
        fields=fields,
    )


def _outcome(
    kind: kinds.TaskKind,
    *,
    task_type: str | None,
    decision: Decision,
    collect: CollectEffect,
    problems: set[str],
    fields: dict[str, Any],
) -> dict[str, Any]:
    return {
        "kind": kind,
        "task_type": task_type,
        "decision": decision,
        "collect": collect,
        "problems": sorted(problems),
        **fields,
    }


def _row(task_type: str | None, fake_doc: bool, problems: set[str]) -> kinds.TaskKindRow | None:
    if task_type is None:
        return None
    if task_type == "":
        if fake_doc:
            # collect() indexes task_type for fake-doc messages: a KeyError when it is absent.
            problems.add("missing:task_type")
            return None
        return kinds.ROW_OF_TYPE.get(kinds.PARSE)
    row = kinds.ROW_OF_TYPE.get(task_type)
    if row is None or row.pattern == kinds.PARSE:
        # The executor would run an unknown type as standard chunking; flag it instead. RAGFlow
        # writes no task_type on a parse task, never "parse" itself.
        problems.add("task_type:unknown")
        return None
    return row


def _collect_lookup(
    task: Mapping[str, Any], raw_type: object, fake_doc: bool
) -> Literal["found", "acks_unknown", "raises"]:
    """How collect()'s task lookup ends: a task, "is unknown" (acked), or an exception."""
    task_id = task.get("id")
    if fake_doc:
        if "task_type" not in task:
            return "raises"
        try:
            dataset_wide = raw_type in kinds.DATASET_WIDE_TYPES
        except TypeError:  # an unhashable task_type fails the set test
            return "raises"
        if not dataset_wide:
            # Used as it is, no lookup (a dataflow run from the canvas editor).
            return "found" if "id" in task else "raises"
        if "id" not in task or "doc_ids" not in task:
            return "raises"
        doc_ids = task["doc_ids"]
        if not doc_ids:
            # get_task joins on the fake doc id itself, which no Document has.
            return "acks_unknown"
        if not isinstance(doc_ids, list | str):
            return "raises"  # doc_ids[0] on a dict or number
        first = doc_ids[0]
        # A string gives its first character: no such document either.
        if isinstance(doc_ids, str) or not _nonempty_str(first) or not _nonempty_str(task_id):
            return "acks_unknown"
        return "found"
    if "id" not in task:
        return "raises"
    if raw_type == "memory":
        # TaskService.get_by_id returns no row for a bad id, and collect() calls .to_dict() on it.
        return "found" if _nonempty_str(task_id) else "raises"
    return "found" if _nonempty_str(task_id) else "acks_unknown"


def _collect_tail_raises(task: Mapping[str, Any], raw_type: object) -> bool:
    """Whether collect() raises after the cancel check, copying message fields onto the task."""
    if not isinstance(raw_type, str):
        # task_type[:8] raises on None, numbers and objects; a list slices quietly.
        return not isinstance(raw_type, list)
    if raw_type[:8] == "dataflow" and not {"tenant_id", "dataflow_id"} <= task.keys():
        return True
    return raw_type[:6] == "memory" and not {"memory_id", "source_id", "message_dict"} <= (
        task.keys()
    )


def _parse_fields(task: Mapping[str, Any], problems: set[str]) -> dict[str, Any]:
    _check_str(task, "doc_id", problems)
    from_page = _check_int(task, "from_page", problems)
    to_page = _check_int(task, "to_page", problems)
    if from_page is not None and to_page is not None:
        if from_page < 0 or to_page < 0:
            problems.add("pages:negative")
        if from_page > to_page:
            problems.add("pages:inverted")
        elif from_page == to_page:
            # queue_tasks always splits into ranges with from_page < to_page; an empty range
            # would be "processed" into no chunks.
            problems.add("pages:empty")
    return {"doc_id": _str_or_none(task.get("doc_id")), "from_page": from_page, "to_page": to_page}


def _dataset_fields(task: Mapping[str, Any], problems: set[str]) -> dict[str, Any]:
    doc_id = task.get("doc_id")
    _check_str(task, "doc_id", problems)
    dataset_scope = doc_id in (kinds.FAKE_DOC_ID, kinds.CANVAS_DEBUG_DOC_ID)
    doc_ids = task.get("doc_ids")
    if dataset_scope:
        # The executor finds the dataset through doc_ids[0]; without it the task is "unknown".
        if "doc_ids" not in task:
            problems.add("missing:doc_ids")
        elif not doc_ids:
            problems.add("fake_doc_id_without_doc_ids")
        elif not _is_str_list(doc_ids):
            problems.add("type:doc_ids")
    elif doc_ids is not None and not _is_str_list(doc_ids):
        # Per-document (raptor): optional, the executor falls back to [doc_id].
        problems.add("type:doc_ids")
    for page in ("from_page", "to_page"):
        if page in task:
            _check_int(task, page, problems)
    return {
        "scope": "dataset" if dataset_scope else "document",
        "doc_id": _str_or_none(doc_id),
        "doc_ids_count": len(doc_ids) if isinstance(doc_ids, list) else None,
    }


def _dataflow_fields(task: Mapping[str, Any], problems: set[str]) -> dict[str, Any]:
    canvas_debug = task.get("doc_id") == kinds.CANVAS_DEBUG_DOC_ID
    _check_str(task, "doc_id", problems)
    _check_str(task, "tenant_id", problems)
    _check_str(task, "dataflow_id", problems)
    kb_id = task.get("kb_id")
    if not canvas_debug:
        # collect() overwrites the row's kb_id with the message's (default ""), so a real
        # document's dataflow needs it in the message.
        _check_str(task, "kb_id", problems)
    elif kb_id is not None and not isinstance(kb_id, str):
        problems.add("type:kb_id")  # a canvas run has no dataset: null or "" are normal
    return {
        "doc_id": _str_or_none(task.get("doc_id")),
        "canvas_debug": canvas_debug,
        "kb_id": _str_or_none(kb_id),
        "tenant_id": _str_or_none(task.get("tenant_id")),
        "dataflow_id": _str_or_none(task.get("dataflow_id")),
    }


def _memory_fields(task: Mapping[str, Any], problems: set[str]) -> dict[str, Any]:
    _check_str(task, "memory_id", problems)
    # collect() copies tenant_id only when truthy, and the executor's TaskContext refuses a
    # task without one.
    _check_str(task, "tenant_id", problems)
    source_id = _check_int(task, "source_id", problems)
    message = task.get("message_dict")
    known_keys: list[str] = []
    other_keys = 0
    if message is None:
        problems.add("missing:message_dict")
    elif not isinstance(message, dict):
        problems.add("type:message_dict")
    else:
        # Key names from RAGFlow's own set only; never a value, never an unexpected key.
        known_keys = sorted(k for k in message if k in MESSAGE_DICT_KEYS)
        other_keys = len(message) - len(known_keys)
        problems.update(
            f"missing:message_dict.{k}" for k in MESSAGE_DICT_REQUIRED if k not in message
        )
    return {
        "memory_id": _str_or_none(task.get("memory_id")),
        "tenant_id": _str_or_none(task.get("tenant_id")),
        "source_id": source_id,
        "message_keys": known_keys,
        "message_other_keys": other_keys,
    }


def _check_str(task: Mapping[str, Any], name: str, problems: set[str]) -> str | None:
    value = task.get(name)
    if value is None or value == "":
        problems.add(f"missing:{name}")
        return None
    if not isinstance(value, str):
        problems.add(f"type:{name}")
        return None
    return value


def _check_int(task: Mapping[str, Any], name: str, problems: set[str]) -> int | None:
    value = task.get(name)
    if value is None:
        problems.add(f"missing:{name}")
        return None
    # bool is an int to Python but never a page number or id to RAGFlow.
    if not isinstance(value, int) or isinstance(value, bool):
        problems.add(f"type:{name}")
        return None
    return value


def _nonempty_str(value: object) -> bool:
    return isinstance(value, str) and value != ""


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(_nonempty_str(v) for v in value)


# The fields each check reads, by the name the task kinds' table gives it.
CHECKS: dict[kinds.DryRunCheck, Callable[[Mapping[str, Any], set[str]], dict[str, Any]]] = {
    "pages": _parse_fields,
    "doc_ids": _dataset_fields,
    "dataflow": _dataflow_fields,
    "memory": _memory_fields,
}
