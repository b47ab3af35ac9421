"""Object metadata patches (``PATCH /storage/v1/b/B/o/O``) carried out as GCS carries them out, over an emulator
that ignores their preconditions, keeps a metadata key set to ``null`` (as an empty string) instead of removing
it, and never moves an object's ``metageneration``. The front answers the patch itself and describes every
object resource it relays with what the patches changed."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote

from ._gcs_rules import Refusal, object_resources

__all__ = ["MetadataPatches"]

Ask = Callable[[str, str, bytes | None], tuple[int, bytes]]
"""``(method, path, body) -> (status, body)`` of a request upstream."""

_PRECONDITIONS = ("ifGenerationMatch", "ifGenerationNotMatch", "ifMetagenerationMatch", "ifMetagenerationNotMatch")


class MetadataPatches:
    """The metageneration and removed metadata keys of every object version the front patched."""

    def __init__(self, ask: Ask) -> None:
        self._ask = ask
        self._versions: dict[tuple[str, str, str], tuple[int, frozenset[str]]] = {}  # -> (metageneration, removed)
        self._lock = threading.Lock()

    @staticmethod
    def target(method: str, path: str) -> tuple[str, str] | None:
        """``(bucket, name)`` of an object patch, else ``None``."""
        parts = path.split("/")
        if method != "PATCH" or not path.startswith("/storage/v1/b/") or len(parts) < 7 or parts[5] != "o":
            return None
        return unquote(parts[4]), unquote("/".join(parts[6:]))

    def patch(self, bucket: str, name: str, params: dict[str, str], body: bytes) -> Refusal | bytes | None:
        """Carry the patch out: GCS's refusal (400 for a body that is not a JSON object, 412 for a precondition
        that does not hold), or the patched resource; ``None`` if the object does not exist (upstream answers)."""
        try:
            patch = json.loads(body or b"{}")
        except ValueError:
            patch = None
        if not isinstance(patch, dict):
            return 400, "Bad Request", "Invalid JSON payload received."
        path = f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"
        status, answer = self._ask("GET", path, None)
        if status != 200:
            return None
        live = self.describe(json.loads(answer))
        now = {"Generation": int(live["generation"]), "Metageneration": int(live["metageneration"])}
        for condition in _PRECONDITIONS:
            if condition in params:
                which = condition.removeprefix("if").replace("NotMatch", "").replace("Match", "")
                holds = now[which] == int(params[condition])
                if holds == condition.endswith("NotMatch"):
                    return 412, "Precondition Failed", "At least one of the pre-conditions you specified did not hold."
        key = (bucket, name, str(live["generation"]))
        removed = set(self._versions.get(key, (0, frozenset()))[1])
        metadata = patch.get("metadata", {})
        if metadata is None:  # the whole map cleared
            metadata = dict.fromkeys(live.get("metadata") or {})
        for meta_key, value in metadata.items():
            if value is None:
                removed.add(meta_key)
            else:
                removed.discard(meta_key)
        upstream = {**patch, "metadata": {k: "" if v is None else v for k, v in metadata.items()}}
        status, answer = self._ask("PATCH", path, json.dumps(upstream).encode())
        if status != 200:
            return None
        with self._lock:
            self._versions[key] = (now["Metageneration"] + 1, frozenset(removed))
        status, answer = self._ask("GET", f"{path}?projection=noAcl", None)
        return json.dumps(self.describe(json.loads(answer))).encode()

    def describe(self, resource: dict[str, Any]) -> dict[str, Any]:
        """``resource`` (an object's, as upstream describes it) with the patches' metageneration and removals."""
        if not isinstance(resource, dict) or "generation" not in resource or "bucket" not in resource:
            return resource
        with self._lock:
            known = self._versions.get((resource["bucket"], resource.get("name", ""), str(resource["generation"])))
        if known is None:
            return resource
        metageneration, removed = known
        resource["metageneration"] = str(metageneration)
        kept = {k: v for k, v in (resource.get("metadata") or {}).items() if k not in removed}
        resource.pop("metadata", None)
        if kept:
            resource["metadata"] = kept
        return resource

    def rewrite(self, body: bytes) -> bytes:
        """A JSON API answer with every object resource in it described as the patches left it."""
        if not self._versions:
            return body
        parsed = object_resources(body)
        if parsed is None:
            return body
        document, resources = parsed
        for resource in resources:
            self.describe(resource)
        return json.dumps(document).encode()
