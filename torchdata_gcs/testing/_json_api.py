"""The JSON API as the front serves it where the emulator falls short of GCS: list pages capped as GCS caps
them, listings from snapshots or by ``matchGlob``, versions read and deleted by generation, the storage layout,
folders, compose requests checked before they go upstream, and answers that describe objects rewritten as
GCS's would be."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

from .._ops.paging import MAX_PAGE_SIZE
from ._folders import Content
from ._match_glob import glob_page
from ._server import BaseFrontHandler, answer_head
from ._stuck_pages import stuck_page

__all__ = [
    "DESCRIBED",
    "STORAGE_LAYOUT",
    "JsonApiHandler",
    "cap_list_page",
    "compose_request",
    "destination_custom_time",
    "object_of",
]

MAX_COMPOSE_SOURCES = 32
STORAGE_LAYOUT = re.compile(r"/storage/v1/b/[^/]+/storageLayout")
DESCRIBED = ("metadata", "list", "compose", "upload")  # kinds whose JSON answers describe objects
_MAX_RESULTS = re.compile(r"(?:^|&)maxResults=(\d+)")


def cap_list_page(target: str, limit: int = MAX_PAGE_SIZE) -> str:
    """Make a JSON API list request ask for at most ``limit`` entries (GCS serves at most 1,000 a page).

    The emulator returns every object in one page when ``maxResults`` is missing; GCS caps pages.

    Examples:
        >>> cap_list_page("/storage/v1/b/bkt/o?prefix=a%2F")
        '/storage/v1/b/bkt/o?prefix=a%2F&maxResults=1000'
        >>> cap_list_page("/storage/v1/b/bkt/o?maxResults=5000&prefix=x")
        '/storage/v1/b/bkt/o?maxResults=1000&prefix=x'
    """
    path, _, query = target.partition("?")
    if re.search(r"(?:^|&)maxResults=(?!\d+(?:&|$))", query):
        return target  # not a number: upstream refuses it, as GCS does
    match = _MAX_RESULTS.search(query)
    if match is None:
        return f"{path}?{query}{'&' if query else ''}maxResults={limit}"
    if int(match.group(1)) <= limit:
        return target
    return f"{path}?{query[: match.start(1)]}{limit}{query[match.end(1) :]}"


def object_of(target: str) -> tuple[str | None, str | None]:
    """``(bucket, name)`` of a JSON API object path (``name`` is ``None`` for a bucket's paths)."""
    parts = target.partition("?")[0].split("/")
    if parts[1:4] == ["storage", "v1", "b"] and len(parts) > 4:
        offset = 4
    elif parts[1:5] in (["download", "storage", "v1", "b"], ["upload", "storage", "v1", "b"]) and len(parts) > 5:
        offset = 5
    else:
        return None, None
    bucket = unquote(parts[offset])
    rest = parts[offset + 1 :]
    if len(rest) < 2 or rest[0] != "o" or not rest[1]:
        return bucket, None
    name = "/".join(rest[1:])
    return bucket, unquote(name.removesuffix("/compose") if target.split("?")[0].endswith("/compose") else name)


def compose_request(data: bytes) -> tuple[list[dict[str, Any]], bool]:
    """The ``sourceObjects`` of a compose request body (none if it is malformed: the emulator answers it),
    and whether it asks for them to be deleted (``deleteSourceObjects``)."""
    try:
        request = json.loads(data)
        sources = request.get("sourceObjects", [])
    except (ValueError, AttributeError):
        return [], False
    deleting = request.get("deleteSourceObjects") is True
    return ([source for source in sources if isinstance(source, dict)] if isinstance(sources, list) else []), deleting


def destination_custom_time(data: bytes) -> str | None:
    """The ``destination.customTime`` of a compose request body, if it gives one."""
    try:
        time = json.loads(data).get("destination", {}).get("customTime")
    except (ValueError, AttributeError):
        return None
    return time if isinstance(time, str) else None


class JsonApiHandler(BaseFrontHandler):
    """The JSON API where the emulator falls short of GCS: the answers the front gives itself, and upstream's
    answers that describe objects, rewritten as GCS's would be."""

    compose_class: str | None = None  # the storage class of the sources of the compose being forwarded
    compose_custom_time: str | None = None  # the custom time the compose being forwarded gives its object
    sources_to_delete: Sequence[tuple[str, int]] = ()  # its sources, with their generations, if it deletes them
    stuck = False  # the request's answer names its own page token as the next one ("repeat_token")

    def describe(
        self, kind: str, bucket: str | None, name: str | None, sources: Sequence[dict[str, Any]], data: bytes
    ) -> bytes:
        """Upstream's JSON answer ``data``, which describes objects, as GCS's would be: a compose's composite
        recorded (its sources deleted for good if it asked, its custom time kept), the KMS key an object was
        written with named, the resources as the front's rules, metadata patches, bucket settings, versions and
        folders have them, and, if ``stuck``, its own page token named as the next one."""
        front = self.server.front
        rules = front.rules
        if kind == "compose" and bucket is not None and name is not None:
            generation = json.loads(data).get("generation")
            if generation is not None:
                components = rules.components_of(bucket, sources)
                rules.add_composite(bucket, name, int(generation), components, self.compose_class)
                for source, source_generation in self.sources_to_delete:  # for good: no soft-deleted copy
                    path = f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(source, safe='')}"
                    self.server.link.ask(f"{path}?generation={source_generation}", "DELETE")
                if self.compose_custom_time is not None:  # the emulator's compose drops it; GCS keeps it
                    path = f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"
                    self.server.link.ask(path, "PATCH", json.dumps({"customTime": self.compose_custom_time}).encode())
                    data = self.server.link.ask(f"{path}?generation={generation}&projection=noAcl")[1]
        self._note_kms_key(kind, data)
        data = front.bucket_overlay.answer(self.path, front.patches.rewrite(rules.rewrite_resources(data)))
        data = self.server.versions.listing(bucket, data) if kind == "list" and bucket is not None else data
        data = front.folders.describe_bucket(self.path, data)
        data = stuck_page(self.path, data) if self.stuck else data
        return data

    def _note_kms_key(self, kind: str, answer: bytes) -> None:
        """Record the Cloud KMS key an upload or compose (``kmsKeyName``) or a finished rewrite
        (``destinationKmsKeyName``) wrote its object with, which the emulator ignores, so the object's
        resources name it as GCS's do."""
        params = dict(parse_qsl(self.path.partition("?")[2]))
        written = json.loads(answer)
        if "/rewriteTo/" in self.path:
            key, written = params.get("destinationKmsKeyName"), written.get("resource") if written.get("done") else None
        else:
            key = params.get("kmsKeyName") if kind in ("upload", "compose") else None
        if key is not None and written is not None:
            self.server.front.rules.add_kms_key(written["bucket"], written["name"], int(written["generation"]), key)

    def answer_from_index(self) -> bool:
        """Answer a list request from the front's snapshot of its bucket, if it has one that fits."""
        front = self.server.front
        path, _, query = self.path.partition("?")
        index = self.server.listings.of(unquote(path.split("/")[4]))
        if index is None:
            return False
        try:
            page = index.page(dict(parse_qsl(query, keep_blank_values=True)))
        except ValueError as exc:
            if self.server.pause(front.latency):
                self.answer_error(400, "Bad Request", str(exc))
            return True
        if page is None:
            return False
        if self.server.pause(front.latency):
            self.answer_json(page)
        return True

    def answer_version(self, kind: str, path: str, params: dict[str, str]) -> bool:
        """Answer as GCS does a JSON API read or delete of a version by its ``generation`` where the emulator
        would not (see ``_versions``); False when the request is to go upstream."""
        bucket, name = object_of(path)
        if "generation" not in params or bucket is None or name is None or not params["generation"].isdigit():
            return False
        versions, generation = self.server.versions, int(params["generation"])
        if kind == "delete":
            with self.server.front.rules.writes:
                outcome = versions.delete(bucket, name, generation)
            if outcome is True:
                return False
            if outcome is False:
                self.wfile.write(answer_head(204, "No Content", []))
            else:
                self.answer_error(*outcome)
            return True
        if self.command == "GET" and versions.gone(bucket, name, generation):
            self.answer_error(404, "Not Found", f"No such object: {bucket}/{name}#{generation}")
            return True
        return False

    def answer_match_glob(self, path: str, params: dict[str, str]) -> bool:
        """Answer a JSON API list request with ``matchGlob`` as GCS does (the emulator ignores it); 400 if
        the glob is invalid. False when the front leaves it upstream (see ``glob_page``)."""
        rules = self.server.front.rules
        try:
            page = glob_page(params, path, self.server.link.ask)
        except ValueError as exc:
            message = f"Invalid matchGlob {params['matchGlob']!r}: {exc}"
            self.answer_error(400, "Bad Request", message, error_reason="invalid")
            return True
        if page is not None:
            self.answer_json(json.loads(rules.rewrite_resources(json.dumps(page).encode())))
        return page is not None

    def answer_json(self, document: dict[str, Any]) -> None:
        body = json.dumps(document).encode()
        body = stuck_page(self.path, body) if self.stuck else body
        headers = [("Content-Type", "application/json; charset=UTF-8"), ("Content-Length", str(len(body)))]
        self.wfile.write(answer_head(200, "OK", headers) + body)

    def answer_storage_layout(self, bucket: str) -> None:
        """GCS's ``getStorageLayout``, which the emulator lacks: the bucket's location as upstream reports it,
        and whether the front gives it a hierarchical namespace."""
        if self.answer_not_found("metadata", bucket, None):
            return
        resource = json.loads(self.server.link.ask(f"/storage/v1/b/{quote(bucket, safe='')}")[1])
        enabled = bucket in self.server.front.folders.hierarchical
        layout = {"kind": "storage#storageLayout", "bucket": bucket, "hierarchicalNamespace": {"enabled": enabled}}
        layout.update({key: resource[key] for key in ("location", "locationType") if key in resource})
        self.answer_json(layout)

    def answer_folders(self, status: int, reason: str, content: Content) -> None:
        """Send the front's own answer about folders: an error message, no body (204), or a JSON document."""
        if isinstance(content, str):
            self.answer_error(status, reason, content)
        elif content is None:
            self.wfile.write(answer_head(status, reason, []))
        else:
            body = self.server.front.rules.rewrite_resources(json.dumps(content).encode())
            headers = [("Content-Type", "application/json; charset=UTF-8"), ("Content-Length", str(len(body)))]
            self.wfile.write(answer_head(status, reason, headers) + body)

    def compose_refusal(self, sources: list[dict[str, Any]], deleting: bool = False) -> tuple[int, str, str] | None:
        """GCS's answer to a compose whose sources are missing or changed; the emulator checks neither.

        More than 32 sources (GCS's limit per call) get 400; a source that does not exist, or whose
        ``generation`` is not the live one (buckets without versioning keep no other), 404; a failed
        ``objectPreconditions.ifGenerationMatch``, 412; sources of more than one storage class, 400
        (the emulator composes them, and makes the composite Standard). A compose that would delete
        its sources (``deleteSourceObjects``, which the emulator ignores) is refused with the 403 of a
        held object's delete if one of them is held; otherwise the front deletes them once it is done.
        """
        bucket = unquote(self.path.split("/")[4])
        if len(sources) > MAX_COMPOSE_SOURCES:
            return (
                400,
                "Bad Request",
                f"The number of source components provided ({len(sources)}) exceeds the maximum (32)",
            )
        front = self.server.front
        classes = set()
        versions: list[tuple[str, int]] = []
        self.compose_class, self.sources_to_delete = None, ()
        for source in sources:
            name = str(source.get("name", ""))
            version = self.server.link.live_version(bucket, name)
            live, storage_class = version if version is not None else (None, None)
            pinned = source.get("generation")
            if live is None or (pinned is not None and int(pinned) != live):
                return 404, "Not Found", f"No such object: {bucket}/{name}" + (f"#{pinned}" if pinned else "")
            wanted = (source.get("objectPreconditions") or {}).get("ifGenerationMatch")
            if wanted is not None and int(wanted) != live:
                return 412, "Precondition Failed", "At least one of the pre-conditions you specified did not hold."
            classes.add(storage_class)
            versions.append((name, live))
            if deleting and front.bucket_overlay.held(bucket, live):
                return front.bucket_overlay.hold_refusal(bucket, name)
        if len(classes) > 1:
            return 400, "Bad Request", "All of the source objects must have the same storage class."
        self.compose_class = classes.pop() if classes else None
        self.sources_to_delete = versions if deleting else ()
        return None
