"""What a bucket's settings mean for torchdata-gcs, and what they cost its objects: the facts ``doctor`` prints.

Each setting (location, requester pays, soft delete, retention, versioning, hierarchical namespace, default
storage class, Autoclass, default event-based hold, lifecycle rules) is told with what it means for temporary
objects, checkpoints and ``clean``, from the bucket resource alone: nothing here makes a request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .lifecycle_rules import describe_rule, missing_rules

__all__ = ["BUCKET_FIELDS", "FACT_NAMES", "LAYOUT_FACTS", "Fact", "bucket_settings"]

BUCKET_FIELDS = (
    "location,locationType,billing/requesterPays,softDeletePolicy/retentionDurationSeconds,"
    "retentionPolicy,versioning/enabled,hierarchicalNamespace/enabled,storageClass,autoclass,defaultEventBasedHold,"
    "lifecycle"
)
"""The bucket resource's fields the facts are told from."""

_MINIMUM_DAYS = {"NEARLINE": 30, "COLDLINE": 90, "ARCHIVE": 365}
"""Minimum storage duration of each cold class: an object deleted or replaced sooner is billed the rest."""


@dataclass(frozen=True)
class Fact:
    """One bucket setting: its value and what it means for composites, checkpoints and ``clean``."""

    name: str
    value: str
    meaning: str = ""


FACT_NAMES = (
    "location",
    "requester pays",
    "soft delete",
    "retention policy",
    "object versioning",
    "hierarchical namespace",
    "default storage class",
    "autoclass",
    "event-based hold",
    "lifecycle",
)


LAYOUT_FACTS = ("location", "hierarchical namespace")
"""What a bucket's storage layout tells."""


def bucket_settings(resource: dict[str, Any], user_project: str | None) -> list[Fact]:
    """The bucket settings ``resource`` reports, each with what it means for this library."""
    location = resource.get("location", "?")
    kind = resource.get("locationType")
    facts = [
        Fact(
            "location",
            f"{location} ({kind})" if kind else str(location),
            "run jobs in this location: reads from elsewhere add latency and network egress charges",
        )
    ]
    if (resource.get("billing") or {}).get("requesterPays"):
        billed = (
            f"billed to {user_project}"
            if user_project
            else "pass --user-project here, ClientConfig(user_project=...) in code"
        )
        facts.append(
            Fact(
                "requester pays",
                "on",
                f"every request, composes and clean's included, is billed to the requester: {billed}",
            )
        )
    else:
        facts.append(Fact("requester pays", "off", "requests are billed to the bucket's project"))
    soft = resource.get("softDeletePolicy")
    if soft is None:
        facts.append(Fact("soft delete", "not reported"))
    elif int(soft.get("retentionDurationSeconds", 0)):
        days = _duration(int(soft["retentionDurationSeconds"]))
        facts.append(
            Fact(
                "soft delete",
                days,
                f"every deleted temporary object (compose_shards_by_gcs's composites, listing locks, what clean "
                f"deletes) and every overwritten checkpoint stays billed {days} after deletion; "
                'strategy="compose" parts are not: each compose deletes its sources for good',
            )
        )
    else:
        facts.append(Fact("soft delete", "off", "deleted temporary objects stop costing at once"))
    retention = resource.get("retentionPolicy")
    if retention:
        value = _duration(int(retention.get("retentionPeriod", 0))) + (", locked" if retention.get("isLocked") else "")
        facts.append(
            Fact(
                "retention policy",
                value,
                "objects cannot be deleted or replaced until they age out: compose_shards_by_gcs and "
                'strategy="compose" leave billed temporary objects, checkpoints cannot be overwritten, '
                "clean deletes nothing younger; "
                "use load_files_by_gcs and multipart checkpoints",
            )
        )
    else:
        facts.append(Fact("retention policy", "none", "temporary objects can be deleted at once"))
    if (resource.get("versioning") or {}).get("enabled"):
        facts.append(
            Fact(
                "object versioning",
                "on",
                "every overwritten checkpoint stays as a noncurrent version, billed until a lifecycle rule "
                "removes it; temporary objects are deleted by generation and leave none",
            )
        )
    else:
        facts.append(Fact("object versioning", "off", "overwrites and deletes leave no noncurrent versions"))
    if (resource.get("hierarchicalNamespace") or {}).get("enabled"):
        facts.append(
            Fact(
                "hierarchical namespace",
                "on",
                "folders outlive their objects: each job's .torchdata-gcs-tmp/<job>/ folder stays behind empty (clean "
                "deletes objects, not folders) and empty folders slow listings",
            )
        )
    else:
        facts.append(Fact("hierarchical namespace", "off", "no folders to clean up"))
    return facts + _cost_facts(resource)


def _cost_facts(resource: dict[str, Any]) -> list[Fact]:
    """What the bucket's storage class, Autoclass, default hold and lifecycle rules cost the library's objects."""
    autoclass = resource.get("autoclass") or {}
    storage_class = resource.get("storageClass")
    days = _MINIMUM_DAYS.get(str(storage_class).upper())
    if storage_class is None:
        facts = [Fact("default storage class", "not reported")]
    elif autoclass.get("enabled"):
        facts = [Fact("default storage class", str(storage_class), "Autoclass picks each object's class (below)")]
    elif days:
        meaning = (
            f"objects written without a class (checkpoints, say) take it: each is billed {days} days at least, so "
            "one overwritten or deleted sooner pays the rest as an early-deletion charge, and reads pay retrieval "
            "fees; torchdata-gcs writes its own temporary objects as Standard"
        )
        facts = [Fact("default storage class", str(storage_class), meaning)]
    else:
        facts = [
            Fact(
                "default storage class",
                str(storage_class),
                "no minimum storage duration: overwrites and deletes cost nothing extra",
            )
        ]
    if autoclass.get("enabled"):
        terminal = autoclass.get("terminalStorageClass", "NEARLINE")
        meaning = (
            f"objects not read for 30 days move to colder classes, down to {terminal}, without early-deletion or "
            "retrieval charges; compose_shards_by_gcs composes objects of one class only (Standard by default) and "
            "loads colder ones directly"
        )
        facts.append(Fact("autoclass", f"on, down to {terminal}", meaning))
    else:
        facts.append(Fact("autoclass", "off", "objects keep the class they were written with"))
    if resource.get("defaultEventBasedHold"):
        meaning = (
            "every new object, torchdata-gcs's temporary objects included, is held, undeletable until its hold is "
            'released: compose_shards_by_gcs\'s composites and strategy="compose" parts pile up, billed; turn the '
            "default hold off, or use load_files_by_gcs and multipart checkpoints (each leaves one small marker)"
        )
        facts.append(Fact("event-based hold", "on", meaning))
    else:
        facts.append(Fact("event-based hold", "off", "new objects can be deleted at once"))
    lifecycle = resource.get("lifecycle")
    rules = (lifecycle or {}).get("rule") or []
    listed = "".join(f"{describe_rule(rule)}; " for rule in rules)
    if missing_rules(lifecycle):
        meaning = f"{listed}missing: the rules that remove torchdata-gcs's leftovers (below)"
    else:
        meaning = f"{listed}covers torchdata-gcs's temporary objects and unfinished multipart uploads"
    count = f"{len(rules)} rule{'s' if len(rules) != 1 else ''}" if rules else "none"
    facts.append(Fact("lifecycle", count, meaning))
    return facts


def _duration(seconds: int) -> str:
    """``seconds`` in days, hours or seconds, whichever is whole.

    >>> _duration(604800), _duration(7200), _duration(90)
    ('7 days', '2 hours', '90 seconds')
    """
    for unit, size in (("day", 86400), ("hour", 3600)):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} seconds"
