"""Folders of buckets with a hierarchical namespace, kept by the GCS front as GCS keeps them: the emulator
has none, so without them no test could see an empty folder, a folder outliving its objects, or a listing
that names folders (``includeFoldersAsPrefixes``)."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote, unquote, urlencode

from .._ops.paging import MAX_PAGE_SIZE
from ._list_index import parse_fields

__all__ = ["Answer", "Content", "Folders", "parents"]

Content = dict[str, Any] | str | None
"""What an answer carries: a JSON document, an error message, or nothing (204)."""
Answer = tuple[int, str, Content]
"""A status, its reason and its content."""


def parents(name: str) -> list[str]:
    """The folders that hold ``name`` (an object's name, or a folder's ending in ``/``), outermost first.

    Examples:
        >>> parents("a/b/c.txt"), parents("a/b/"), parents("top.txt")
        (['a/', 'a/b/'], ['a/'], [])
    """
    pieces = name.rstrip("/").split("/")[:-1]
    return ["/".join(pieces[: depth + 1]) + "/" for depth in range(len(pieces))]


def _encode_token(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode()


def _decode_token(token: str) -> str:
    return base64.urlsafe_b64decode(token.encode()).decode()


class Folders:
    """The folders of the ``hierarchical`` buckets; ``ask`` GETs a path from upstream (status, body).

    A folder exists for every parent path of every object, and for every folder created
    (``folders.insert``); it outlives its objects until deleted (``folders.delete``, only when empty).
    A listing with ``delimiter=/`` and ``includeFoldersAsPrefixes=true`` names the folders one level
    down among its ``prefixes``, empty ones too; without the parameter only folders holding objects
    appear, as in any bucket. ``includeFoldersAsPrefixes=true`` with another delimiter, or none, is
    refused, as GCS documents it as requiring ``delimiter=/``. Those listings are answered here from
    upstream's objects: ``prefix``, ``startOffset``, ``endOffset``, ``maxResults``, ``pageToken`` and
    ``fields`` apply, other parameters (``versions``, ``matchGlob``, ...) do not. The folders of objects
    deleted otherwise than by a JSON API ``DELETE`` through the front (the XML API, compose's
    ``deleteSourceObjects``, the emulator directly) are not kept. The folders resource (get, insert,
    delete) answers for these buckets only, and their bucket resource says ``hierarchicalNamespace``.
    """

    def __init__(self, hierarchical: Iterable[str], ask: Callable[[str], tuple[int, bytes]]) -> None:
        self.hierarchical = frozenset(hierarchical)
        self._ask = ask
        self._lock = threading.Lock()
        self._kept: dict[str, set[str]] = {}  # created, or left behind by deleted objects

    def answer(self, method: str, path: str, params: dict[str, str], body: Callable[[], bytes]) -> Answer | None:
        """The front's answer to a request on folders, or to a listing that must name them; ``None``: the
        request goes upstream (the folders of an object it deletes are kept first, as GCS keeps them)."""
        parts = path.split("/")
        if parts[1:4] != ["storage", "v1", "b"] or len(parts) < 6:
            return None
        bucket = unquote(parts[4])
        if parts[5] == "o" and len(parts) == 6 and method == "GET" and "includeFoldersAsPrefixes" in params:
            return self._listing(bucket, params)
        if parts[5] == "o" and len(parts) == 7 and method == "DELETE" and bucket in self.hierarchical:
            self._keep_parents_of(bucket, unquote(parts[6]))
            return None
        if parts[5] != "folders":
            return None
        if bucket not in self.hierarchical:
            return 400, "Bad Request", "The bucket does not have hierarchical namespace enabled."
        if len(parts) == 6 and method == "POST":
            return self._insert(bucket, json.loads(body() or b"{}").get("name", ""), params)
        folder = unquote("/".join(parts[6:]))
        folder = folder if folder.endswith("/") else f"{folder}/"
        if method == "GET":
            if folder in self._all(bucket, folder):
                return 200, "OK", self._resource(bucket, folder)
            return 404, "Not Found", f"The folder {folder} does not exist."
        if method == "DELETE":
            return self._delete(bucket, folder)
        return None

    def describe_bucket(self, path: str, body: bytes) -> bytes:
        """A bucket resource (``GET /storage/v1/b/B``) that says whether the bucket has a hierarchical namespace,
        as GCS's does when asked for ``hierarchicalNamespace`` (the emulator's never does)."""
        route, _, query = path.partition("?")
        parts = route.rstrip("/").split("/")
        if parts[1:4] != ["storage", "v1", "b"] or len(parts) != 5 or unquote(parts[4]) not in self.hierarchical:
            return body
        if "fields=" in query and "hierarchicalNamespace" not in unquote(query):
            return body
        document = json.loads(body)
        document["hierarchicalNamespace"] = {"enabled": True}
        return json.dumps(document).encode()

    def _keep_parents_of(self, bucket: str, name: str) -> None:
        status, _ = self._ask(f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}?fields=name")
        if status == 200:
            with self._lock:
                self._kept.setdefault(bucket, set()).update(parents(name))

    def _objects(self, bucket: str, prefix: str) -> list[dict[str, Any]]:
        """Every object upstream under ``prefix``, in name order."""
        resources: list[dict[str, Any]] = []
        params = {"prefix": prefix, "maxResults": str(MAX_PAGE_SIZE)}
        while True:
            status, answer = self._ask(f"/storage/v1/b/{quote(bucket, safe='')}/o?{urlencode(params)}")
            if status != 200:
                return resources
            page = json.loads(answer)
            resources += page.get("items", [])
            if not page.get("nextPageToken"):
                return resources
            params["pageToken"] = page["nextPageToken"]

    def _all(self, bucket: str, prefix: str) -> set[str]:
        """The folders under ``prefix`` (itself included): kept ones, and the parents of objects."""
        with self._lock:
            folders = {folder for folder in self._kept.get(bucket, ()) if folder.startswith(prefix)}
        for resource in self._objects(bucket, prefix):
            folders.update(folder for folder in parents(resource["name"]) if folder.startswith(prefix))
        return folders

    def _listing(self, bucket: str, params: dict[str, str]) -> Answer | None:
        if params["includeFoldersAsPrefixes"] != "true":
            return None
        if params.get("delimiter") != "/":
            return 400, "Bad Request", "includeFoldersAsPrefixes is only supported when delimiter is '/'."
        if bucket not in self.hierarchical:
            return None  # no folders to add (managed folders are not modelled)
        prefix = params.get("prefix", "")
        items: dict[str, dict[str, Any]] = {}
        prefixes: set[str] = set()
        for resource in self._objects(bucket, prefix):
            rest = resource["name"][len(prefix) :]
            if "/" in rest:
                prefixes.add(prefix + rest[: rest.index("/") + 1])
            else:
                items[resource["name"]] = resource
        prefixes.update(f for f in self._all(bucket, prefix) if f != prefix and "/" not in f[len(prefix) : -1])
        start = max(params.get("startOffset", ""), _decode_token(params["pageToken"]) if "pageToken" in params else "")
        end = params.get("endOffset")
        names = sorted(name for name in {*items, *prefixes} if name >= start and (not end or name < end))
        size = min(int(params.get("maxResults", MAX_PAGE_SIZE)), MAX_PAGE_SIZE)
        page = names[:size]
        document: dict[str, Any] = {"kind": "storage#objects"}
        if any(name in items for name in page):
            document["items"] = [items[name] for name in page if name in items]
        if any(name in prefixes for name in page):
            document["prefixes"] = [name for name in page if name in prefixes]
        if len(names) > size:
            document["nextPageToken"] = _encode_token(names[size])
        if "fields" in params:
            selected = parse_fields(params["fields"])
            document = {key: value for key, value in document.items() if key in selected}
            wanted = selected.get("items")
            if wanted and "items" in document:
                document["items"] = [{key: item[key] for key in wanted if key in item} for item in document["items"]]
        return 200, "OK", document

    def _insert(self, bucket: str, folder: str, params: dict[str, str]) -> Answer:
        if not folder.endswith("/") or folder.startswith("/") or "//" in folder:
            return 400, "Bad Request", f"Invalid folder name {folder!r}: it must end with '/'."
        existing = self._all(bucket, "")
        if folder in existing:
            return 409, "Conflict", f"The folder {folder} already exists."
        missing = [parent for parent in parents(folder) if parent not in existing]
        if missing and params.get("recursive") != "true":
            return 404, "Not Found", f"The parent folder {missing[-1]} does not exist."
        with self._lock:
            self._kept.setdefault(bucket, set()).update([*missing, folder])
        return 200, "OK", self._resource(bucket, folder)

    def _delete(self, bucket: str, folder: str) -> Answer:
        if folder not in self._all(bucket, folder):
            return 404, "Not Found", f"The folder {folder} does not exist."
        if self._objects(bucket, folder) or len(self._all(bucket, folder)) > 1:
            return 409, "Conflict", f"The folder {folder} is not empty."
        with self._lock:
            self._kept.get(bucket, set()).discard(folder)
        return 204, "No Content", None

    @staticmethod
    def _resource(bucket: str, folder: str) -> dict[str, Any]:
        return {"kind": "storage#folder", "bucket": bucket, "name": folder, "id": f"{bucket}/{folder}"}
