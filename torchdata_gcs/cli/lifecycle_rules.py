"""The lifecycle rules that remove what killed torchdata-gcs jobs leave behind, and whether a bucket has them.

A job killed before it cleans up leaves temporary objects under ``TEMPORARY_PREFIX`` and unfinished XML
multipart uploads, both billed until removed. ``torchdata-gcs clean`` removes them when run; two lifecycle
rules make GCS remove them on its own: ``AbortIncompleteMultipartUpload`` and a ``Delete`` restricted to
the prefix by ``matchesPrefix``. ``doctor`` reports the bucket's rules and prints the configuration to
give ``gcloud storage buckets update gs://B --lifecycle-file=FILE``, which replaces the whole
configuration: the bucket's own rules are kept in it.
"""

from __future__ import annotations

from typing import Any

from .._ops.urls import TEMPORARY_PREFIX

__all__ = ["RECOMMENDED_RULES", "describe_rule", "lifecycle_file", "missing_rules"]

UPLOAD_AGE_DAYS = 1
TEMPORARY_AGE_DAYS = 1
"""Both match ``clean --older-than``'s default (1d): a running job's temporary objects and uploads are younger."""

RECOMMENDED_RULES: tuple[dict[str, Any], ...] = (
    {"action": {"type": "AbortIncompleteMultipartUpload"}, "condition": {"age": UPLOAD_AGE_DAYS}},
    {"action": {"type": "Delete"}, "condition": {"age": TEMPORARY_AGE_DAYS, "matchesPrefix": [TEMPORARY_PREFIX]}},
)
"""GCS lifecycle rules (``age`` in days since creation, or since initiation for an upload)."""

_WIDE_CONDITIONS = frozenset({"age", "matchesPrefix"})  # any other condition narrows a rule further


def _covers(rule: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether ``rule`` acts as ``wanted`` does on everything ``wanted`` reaches, sooner or later: same action,
    an age, no condition but name prefixes, and a prefix (if any) that every name ``wanted`` reaches has.

    Examples:
        >>> _covers({"action": {"type": "Delete"}, "condition": {"age": 30}}, RECOMMENDED_RULES[1])
        True
        >>> _covers({"action": {"type": "Delete"}, "condition": {"age": 3, "isLive": False}}, RECOMMENDED_RULES[1])
        False
    """
    condition = rule.get("condition") or {}
    if (rule.get("action") or {}).get("type") != wanted["action"]["type"] or "age" not in condition:
        return False
    if set(condition) - _WIDE_CONDITIONS:
        return False
    reached = wanted["condition"].get("matchesPrefix", [""])
    prefixes = condition.get("matchesPrefix")
    return prefixes is None or all(any(name.startswith(prefix) for prefix in prefixes) for name in reached)


def missing_rules(lifecycle: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The :data:`RECOMMENDED_RULES` that no rule of ``lifecycle`` (a bucket's ``lifecycle`` field) covers."""
    rules = (lifecycle or {}).get("rule") or []
    return [dict(wanted) for wanted in RECOMMENDED_RULES if not any(_covers(rule, wanted) for rule in rules)]


def lifecycle_file(lifecycle: dict[str, Any] | None, missing: list[dict[str, Any]]) -> dict[str, Any]:
    """The configuration to set: the bucket's rules, then ``missing``.

    Examples:
        >>> lifecycle_file(None, [RECOMMENDED_RULES[0]])
        {'lifecycle': {'rule': [{'action': {'type': 'AbortIncompleteMultipartUpload'}, 'condition': {'age': 1}}]}}
    """
    return {"lifecycle": {"rule": [*((lifecycle or {}).get("rule") or []), *missing]}}


def describe_rule(rule: dict[str, Any]) -> str:
    """One rule in a few words.

    Examples:
        >>> describe_rule(RECOMMENDED_RULES[1])
        'Delete if age 1, matchesPrefix .torchdata-gcs-tmp/'
        >>> describe_rule({"action": {"type": "SetStorageClass", "storageClass": "COLDLINE"}, "condition": {}})
        'SetStorageClass COLDLINE'
    """
    action = rule.get("action") or {}
    words = " ".join(str(part) for part in (action.get("type", "?"), action.get("storageClass")) if part)
    conditions = ", ".join(
        f"{key} {'|'.join(map(str, value)) if isinstance(value, list) else value}"
        for key, value in (rule.get("condition") or {}).items()
    )
    return f"{words} if {conditions}" if conditions else words
