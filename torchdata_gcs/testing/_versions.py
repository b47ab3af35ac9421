"""Object versions named by their generation, as GCS treats them and the emulator does not.

GCS deletes the version a JSON API ``DELETE ...?generation=G`` names for good, live or noncurrent, and
answers 404 when there is no such version. fake-gcs-server ignores ``generation`` there: it deletes the
live object whatever is named (keeping it as a noncurrent version in a bucket with versioning) and never
removes a noncurrent one. :class:`Versions` carries such deletes out for the front: it answers 404 for a
version that does not exist, lets the delete of the live version go upstream, answers that of a
noncurrent one itself, and from then on hides every version deleted so: a read of it
(``?generation=G``) gets 404 and listings leave it out.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from urllib.parse import quote

Ask = Callable[[str], tuple[int, bytes]]
Refusal = tuple[int, str, str]


class Versions:
    """The versions deleted by generation through the front (see the module's docstring)."""

    def __init__(self, ask: Ask) -> None:
        self._ask = ask
        self._gone: set[tuple[str, str, int]] = set()
        self._lock = threading.Lock()

    def _upstream(self, bucket: str, name: str, generation: int | None) -> int | None:
        """The generation of ``bucket/name`` upstream (at ``generation``, else the live one), if it is there."""
        path = f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}?fields=generation"
        status, body = self._ask(path + (f"&generation={generation}" if generation is not None else ""))
        return int(json.loads(body)["generation"]) if status == 200 else None

    def gone(self, bucket: str, name: str, generation: int) -> bool:
        """Whether that version was deleted by its generation through the front."""
        with self._lock:
            return (bucket, name, generation) in self._gone

    def delete(self, bucket: str, name: str, generation: int) -> Refusal | bool:
        """Carry out a delete of version ``generation``: GCS's 404 if it is not there, ``True`` when the
        delete is to go upstream (it is the live version), ``False`` when it is done (a noncurrent one)."""
        if self.gone(bucket, name, generation) or self._upstream(bucket, name, generation) is None:
            return 404, "Not Found", f"No such object: {bucket}/{name}#{generation}"
        with self._lock:
            self._gone.add((bucket, name, generation))
        return self._upstream(bucket, name, None) == generation

    def listing(self, bucket: str, body: bytes) -> bytes:
        """A list page of ``bucket`` without the versions deleted by generation."""
        with self._lock:
            gone = {(name, generation) for b, name, generation in self._gone if b == bucket}
        if not gone:
            return body
        page = json.loads(body)
        items = page.get("items", [])
        kept = [item for item in items if (item.get("name"), int(item.get("generation", 0))) not in gone]
        if len(kept) == len(items):
            return body
        page["items"] = kept
        return json.dumps(page).encode()
