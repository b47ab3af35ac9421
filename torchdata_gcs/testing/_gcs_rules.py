"""What GCS checks and promises that the emulator does not, applied by the test front.

fake-gcs-server ignores preconditions on deletes, media uploads and compose destinations, gives
every object an MD5 (GCS gives composite and multipart-uploaded objects none, and a
``componentCount`` instead), sends ``x-goog-hash`` as one line and answers "Not Found" to a missing
bucket and a missing object alike. :class:`GCSRules` makes the front's answers as strict and as
telling as GCS's, and optionally leaves out every response header that GCS does not promise, so
clients are tested against what GCS guarantees rather than what it usually sends.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import unquote
from xml.sax.saxutils import escape

__all__ = [
    "NO_SUCH_BUCKET",
    "OBJECT_ONLY_PRINCIPAL",
    "PROMISED_ON_PARTS",
    "GCSRules",
    "Refusal",
    "bucket_call_refusal",
    "bucket_permission",
    "denied",
    "object_resources",
    "split_hash_lines",
]

Refusal = tuple[int, str, str]
"""Status, reason and message of an answer that refuses a request."""
Headers = list[tuple[str, str]]
LiveGeneration = Callable[[str, str], "int | None"]
BucketExists = Callable[[str], bool]

NO_SUCH_BUCKET = "The specified bucket does not exist."
"""GCS's words for a missing bucket, in every API."""

OBJECT_ONLY_PRINCIPAL = "object-only@torchdata-gcs-test.iam.gserviceaccount.com"
"""Who the front says is refused when it acts as an identity with object roles only."""

_BUCKET_VERBS = {"GET": "get", "HEAD": "get", "DELETE": "delete", "PUT": "update", "PATCH": "update"}

PROMISED_ON_PARTS = frozenset({"etag", "x-goog-hash"})
"""What an XML API part upload answer always carries: the ETag that completion names, and the
checksum of the stored part (the official client refuses a part answer without it)."""
_ALWAYS_KEPT = frozenset(
    {"content-type", "content-encoding", "content-range", "location", "retry-after", "connection", "date", "server"}
)
"""HTTP's own headers, which say how to read the answer; GCS sends them wherever they apply."""


def split_hash_lines(headers: Headers, *, drop_md5: bool = False) -> Headers:
    """``headers`` with each ``x-goog-hash`` value on a line of its own, ``md5`` first (GCS sends them
    as separate lines in no promised order), without ``md5`` if ``drop_md5``.

    Examples:
        >>> split_hash_lines([("X-Goog-Hash", "crc32c=AAAAAA==,md5=1B2M2Y8AsgTpgAmY7PhCfg==")])
        [('x-goog-hash', 'md5=1B2M2Y8AsgTpgAmY7PhCfg=='), ('x-goog-hash', 'crc32c=AAAAAA==')]
    """
    values = [
        item.strip()
        for name, value in headers
        if name.lower() == "x-goog-hash"
        for item in value.split(",")
        if item.strip() and not (drop_md5 and item.strip().startswith("md5="))
    ]
    values.sort(key=lambda value: not value.startswith("md5="))
    others = [(name, value) for name, value in headers if name.lower() != "x-goog-hash"]
    return others + [("x-goog-hash", value) for value in values]


def bucket_permission(method: str, path: str) -> tuple[str, str] | None:
    """The ``storage.buckets.*`` permission a JSON API call needs, and on what (``"project"`` for listing
    and creating buckets, else ``"bucket"``); ``None`` for calls on objects, folders and the storage
    layout, which object roles grant (Storage Object Viewer, Creator, User and Admin hold no
    ``storage.buckets.*`` permission), and for the bucket's ACLs and notifications, not modelled.

    Examples:
        >>> bucket_permission("GET", "/storage/v1/b/bkt"), bucket_permission("GET", "/storage/v1/b/bkt/o")
        (('storage.buckets.get', 'bucket'), None)
        >>> bucket_permission("PUT", "/storage/v1/b/bkt/iam"), bucket_permission("POST", "/storage/v1/b")
        (('storage.buckets.setIamPolicy', 'bucket'), ('storage.buckets.create', 'project'))
    """
    parts = path.rstrip("/").split("/")
    if parts[1:4] != ["storage", "v1", "b"]:
        return None
    if len(parts) == 4:
        return ("storage.buckets.list" if method == "GET" else "storage.buckets.create"), "project"
    if len(parts) == 5:
        return f"storage.buckets.{_BUCKET_VERBS.get(method, 'get')}", "bucket"
    if parts[5:] == ["iam"]:
        return ("storage.buckets.getIamPolicy" if method == "GET" else "storage.buckets.setIamPolicy"), "bucket"
    return None


def bucket_call_refusal(
    method: str, path: str, params: dict[str, str], holds_objects: Callable[[str], bool]
) -> Refusal | None:
    """GCS's refusal of a JSON API bucket call that the emulator carries out or answers otherwise: listing or
    creating buckets without ``project`` (400; the emulator needs none), deleting a bucket that
    ``holds_objects`` (409; the emulator answers 412).

    Examples:
        >>> bucket_call_refusal("GET", "/storage/v1/b", {}, lambda bucket: False)
        (400, 'Bad Request', 'Required parameter: project')
        >>> bucket_call_refusal("DELETE", "/storage/v1/b/bkt", {}, lambda bucket: True)
        (409, 'Conflict', 'The bucket you tried to delete is not empty.')
    """
    parts = path.rstrip("/").split("/")
    if parts[1:4] != ["storage", "v1", "b"]:
        return None
    if len(parts) == 4 and method in ("GET", "POST") and not params.get("project"):
        return 400, "Bad Request", "Required parameter: project"
    if len(parts) == 5 and method == "DELETE" and holds_objects(unquote(parts[4])):
        return 409, "Conflict", "The bucket you tried to delete is not empty."
    return None


def denied(permission: str, resource: str) -> Refusal:
    """GCS's 403 for :data:`OBJECT_ONLY_PRINCIPAL` lacking ``permission`` on a ``"bucket"`` or ``"project"``."""
    what = "the Google Cloud Storage bucket" if resource == "bucket" else "the Google Cloud project"
    words = f"Permission '{permission}' denied on resource (or it may not exist)."
    return 403, "Forbidden", f"{OBJECT_ONLY_PRINCIPAL} does not have {permission} access to {what}. {words}"


def object_resources(body: bytes) -> tuple[dict[str, Any], list[Any]] | None:
    """A JSON API answer's document and the object resources in it (its ``items``, or itself), or ``None``
    if it is not a JSON object."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    return document, document.get("items", []) if "items" in document else [document]


def _holds(wanted: str, live: int | None) -> bool:
    """Whether a generation precondition value (0: no live version) holds for ``live``."""
    return live is None if int(wanted) == 0 else live == int(wanted)


class GCSRules:
    """One front's view of what GCS would refuse or leave out.

    Args:
        live_generation: ``(bucket, name) -> generation`` of the live version upstream, or ``None``.
        bucket_exists: ``bucket -> whether it exists upstream``.
        only_promised_headers: leave out every response header GCS does not promise to send...
        also_send: ...but these (lower case), to see how a client copes with each other one missing.
    """

    def __init__(
        self,
        live_generation: LiveGeneration,
        bucket_exists: BucketExists,
        *,
        only_promised_headers: bool = False,
        also_send: Sequence[str] = (),
    ) -> None:
        self._live_generation = live_generation
        self.bucket_exists = bucket_exists
        self.only_promised_headers = only_promised_headers
        self._also_sent = frozenset(name.lower() for name in also_send)
        self._composites: dict[tuple[str, str], tuple[int, int]] = {}  # -> (generation, component count)
        self._classes: dict[tuple[str, str, int], str] = {}  # composite version -> its sources' storage class
        self._keys: dict[tuple[str, str, int], str] = {}  # object version -> the Cloud KMS key it was written with
        self._lock = threading.Lock()
        self.writes = threading.Lock()
        """Held by the front while it checks a write's precondition and carries the write out."""

    # -- preconditions ------------------------------------------------------------------------------

    def precondition_refusal(self, method: str, path: str, params: dict[str, str]) -> Refusal | None:
        """412 for a JSON API delete, media upload, compose or rewrite whose ``ifGenerationMatch`` or
        ``ifGenerationNotMatch`` does not hold (the emulator enforces them on multipart uploads only)."""
        conditions = {key: params[key] for key in ("ifGenerationMatch", "ifGenerationNotMatch") if key in params}
        target = self._target(method, path, params)
        if not conditions or target is None:
            return None
        live = self._live_generation(*target)
        if method == "DELETE" and live is None:
            return None  # the emulator answers 404, as GCS does
        match, not_match = conditions.get("ifGenerationMatch"), conditions.get("ifGenerationNotMatch")
        if (match is not None and not _holds(match, live)) or (not_match is not None and _holds(not_match, live)):
            return 412, "Precondition Failed", "At least one of the pre-conditions you specified did not hold."
        return None

    @staticmethod
    def _target(method: str, path: str, params: dict[str, str]) -> tuple[str, str] | None:
        """``(bucket, name)`` that a JSON API write with preconditions acts on, when the front checks it."""
        parts = path.split("/")
        if method == "DELETE" and path.startswith("/storage/v1/b/") and len(parts) >= 7:
            return unquote(parts[4]), unquote("/".join(parts[6:]))
        if method == "POST" and path.startswith("/storage/v1/b/") and path.endswith("/compose"):
            return unquote(parts[4]), unquote("/".join(parts[6:-1]))
        if method == "POST" and path.startswith("/storage/v1/b/") and "/rewriteTo/b/" in path:
            bucket, _, name = path.partition("/rewriteTo/b/")[2].partition("/o/")
            return unquote(bucket), unquote(name)
        if path.startswith("/upload/storage/v1/b/") and params.get("uploadType") == "media" and "name" in params:
            return unquote(parts[5]), params["name"]
        return None

    # -- what is missing ---------------------------------------------------------------------------

    def not_found(self, bucket: str, name: str | None, api: str) -> tuple[str, bytes] | None:
        """The content type and body of GCS's 404 for object ``name`` (``None``: the bucket itself) of
        ``bucket`` through ``api``: ``"json"``, an error document naming a missing bucket apart from a
        missing object; ``"media"``, a media read's bare text of the same words; ``"xml"``,
        ``NoSuchBucket`` or ``NoSuchKey``. ``None`` if the bucket exists and no object is named."""
        if self.bucket_exists(bucket):
            if name is None:
                return None
            message, code = f"No such object: {bucket}/{name}", "NoSuchKey"
        else:
            message, code = NO_SUCH_BUCKET, "NoSuchBucket"
        if api == "xml":
            words = NO_SUCH_BUCKET if code == "NoSuchBucket" else "The specified key does not exist."
            details = "" if code == "NoSuchBucket" else f"<Details>{escape(message)}</Details>"
            body = (
                f"<?xml version='1.0' encoding='UTF-8'?>"
                f"<Error><Code>{code}</Code><Message>{words}</Message>{details}</Error>"
            )
            return "application/xml; charset=UTF-8", body.encode()
        if api == "media":
            return "text/html; charset=UTF-8", message.encode()
        error = {"message": message, "domain": "global", "reason": "notFound"}
        return "application/json; charset=UTF-8", json.dumps(
            {"error": {"code": 404, "message": message, "errors": [error]}}, indent=2
        ).encode()

    # -- composite objects -------------------------------------------------------------------------

    def add_composite(
        self, bucket: str, name: str, generation: int, components: int, storage_class: str | None = None
    ) -> None:
        """Record a composite the front saw being made; a compose's has its sources' ``storage_class``
        (GCS's rule; the emulator makes every composite Standard)."""
        with self._lock:
            self._composites[(bucket, name)] = (generation, components)
            if storage_class is not None:
                self._classes[(bucket, name, generation)] = storage_class

    def component_count(self, bucket: str, name: str, generation: int | None = None) -> int | None:
        """How many components the version ``generation`` (default: the one last recorded) is made of,
        if it is a composite (or a multipart upload) the front saw being made."""
        with self._lock:
            known = self._composites.get((bucket, name))
        if known is None or (generation is not None and known[0] != generation):
            return None
        return known[1]

    def components_of(self, bucket: str, sources: Sequence[dict[str, Any]]) -> int:
        """A compose's component count: each source counts its own components, or one."""
        return sum(self.component_count(bucket, str(source.get("name", ""))) or 1 for source in sources)

    # -- customer-managed encryption keys -----------------------------------------------------------

    def add_kms_key(self, bucket: str, name: str, generation: int, key: str) -> None:
        """Record that a version was written with the Cloud KMS ``key`` (``kmsKeyName``, which the emulator
        ignores): its resource names it, as GCS names it, with the key version used."""
        with self._lock:
            self._keys[(bucket, name, generation)] = f"{key}/cryptoKeyVersions/1"

    def rewrite_resources(self, body: bytes) -> bytes:
        """A JSON API answer with composite objects described as GCS describes them: no ``md5Hash``,
        a ``componentCount``, their sources' ``storageClass``; and a ``kmsKeyName`` for an object written
        with one."""
        parsed = object_resources(body)
        if parsed is None:
            return body
        document, resources = parsed
        changed = False
        for resource in resources:
            if not isinstance(resource, dict) or "bucket" not in resource or "generation" not in resource:
                continue
            version = (resource["bucket"], resource.get("name", ""), int(resource["generation"]))
            with self._lock:
                key = self._keys.get(version)
            if key is not None:
                resource["kmsKeyName"] = key
                changed = True
            count = self.component_count(*version)
            if count is not None:
                resource.pop("md5Hash", None)
                resource["componentCount"] = count
                storage_class = self._classes.get(
                    (resource["bucket"], resource.get("name", ""), int(resource["generation"]))
                )
                if storage_class is not None and "storageClass" in resource:
                    resource["storageClass"] = storage_class
                changed = True
        return json.dumps(document).encode() if changed else body

    # -- answer headers ----------------------------------------------------------------------------

    def sends(self, header: str) -> bool:
        """Whether answers carry ``header`` (lower case) where upstream sends it."""
        return not self.only_promised_headers or header in _ALWAYS_KEPT | self._also_sent

    def answer_headers(
        self,
        headers: Headers,
        *,
        bucket: str | None = None,
        name: str | None = None,
        keep: frozenset[str] = frozenset(),
    ) -> Headers:
        """The headers the front sends for an answer about ``bucket/name``: hashes on separate lines
        (no ``md5`` for a composite), and in ``only_promised_headers`` mode only what GCS promises
        (``keep`` names what it promises for this answer, beyond the content type)."""
        generation = next((value for key, value in headers if key.lower() == "x-goog-generation"), None)
        composite = (
            bucket is not None
            and name is not None
            and generation is not None
            and self.component_count(bucket, name, int(generation)) is not None
        )
        headers = split_hash_lines(headers, drop_md5=composite)
        if self.only_promised_headers:
            kept = _ALWAYS_KEPT | keep | self._also_sent
            headers = [(key, value) for key, value in headers if key.lower() in kept]
        return headers
