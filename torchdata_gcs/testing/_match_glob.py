"""GCS's ``matchGlob`` on object listings, which the emulator ignores: which names a glob selects, and
the pages of a listing filtered by it (up to ``maxResults`` selected objects a page, as GCS sends them).

The reading is the narrowest that GCS's documentation and the official client's tests against GCS
allow, so a client that needs GCS to send a name finds out here if a glob leaves it out: ``*`` stays
within one level of ``/``; ``**`` crosses levels, also next to other characters (``foo**bar`` selects
``foo/bar``), and a leading ``**/`` may match no level; ``?`` and a set (``[a-z]``, ``[!a-y]``) take one
character other than ``/``; ``{a,b}`` takes either; ``\\`` makes the next character literal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode

from .._ops.paging import MAX_PAGE_SIZE
from ._list_index import ListingIndex

__all__ = ["glob_pattern", "glob_page"]

_UPSTREAM = ("prefix", "startOffset", "endOffset", "userProject")


def glob_pattern(glob: str) -> re.Pattern[str]:
    """The regular expression of the names ``glob`` selects; ``ValueError`` if GCS would refuse it.

    >>> [bool(glob_pattern("foo**bar").fullmatch(n)) for n in ("foo/bar", "foo/foobar", "foobar", "fo/bar")]
    [True, True, True, False]
    >>> [bool(glob_pattern("**/{foobar,baz}").fullmatch(n)) for n in ("foo/baz", "foobar", "foo/bar")]
    [True, True, False]
    >>> glob_pattern("a[bc")
    Traceback (most recent call last):
    ValueError: the set opened at 1 is not closed
    """
    regex, end = _translate(glob, 0, nested=False)
    if end != len(glob):
        raise ValueError(f"unexpected {glob[end]!r} at {end}")
    return re.compile(regex, re.DOTALL)


def _translate(glob: str, start: int, *, nested: bool) -> tuple[str, int]:
    """The regular expression of ``glob`` from ``start`` up to its end, or (``nested``) up to the ``,``
    or ``}`` that ends an alternative; and where it stopped."""
    parts: list[str] = []
    index = start
    while index < len(glob):
        char = glob[index]
        if char == "\\":
            if index + 1 == len(glob):
                raise ValueError("the glob ends in an escape")
            parts.append(re.escape(glob[index + 1]))
            index += 2
        elif char == "*":
            stars = len(glob) - index - len(glob[index:].lstrip("*"))
            index += stars
            if stars == 1:
                parts.append("[^/]*")
            elif index - stars == 0 and glob[index : index + 1] == "/":
                parts.append("(?:.*/)?")  # a leading ``**/``: any number of levels, none included
                index += 1
            else:
                parts.append(".*")
        elif char == "?":
            parts.append("[^/]")
            index += 1
        elif char == "[":
            close = glob.find("]", index + 2)
            if close < 0:
                raise ValueError(f"the set opened at {index} is not closed")
            body = glob[index + 1 : close]
            negated = body.startswith("!")
            members = "".join(c if c == "-" else re.escape(c) for c in body[negated:])
            if not members:
                raise ValueError(f"the set at {index} is empty")
            parts.append(f"[^/{members}]" if negated else f"(?!/)[{members}]")
            index = close + 1
        elif char == "{":
            alternatives = []
            index += 1
            while True:
                regex, index = _translate(glob, index, nested=True)
                alternatives.append(regex)
                if index == len(glob):
                    raise ValueError("a brace is not closed")
                index += 1
                if glob[index - 1] == "}":
                    break
            parts.append(f"(?:{'|'.join(alternatives)})")
        elif nested and char in ",}":
            return "".join(parts), index
        elif char == "}":
            raise ValueError(f"a brace closes at {index} that none opened")
        else:
            parts.append(re.escape(char))
            index += 1
    return "".join(parts), index


def glob_page(params: Mapping[str, str], path: str, ask: Callable[[str], tuple[int, bytes]]) -> Any:
    """The answer to a list request of ``path`` with ``matchGlob`` (``params``): every object in its
    range, listed upstream page by page with ``ask`` (``/path?query`` to status and body), kept if the
    glob selects it, then the page asked for. ``None`` when upstream refused, or when the request asks
    for what is not modelled here (``delimiter``, ``versions``, ...): it then goes upstream as it came.
    Raises ``ValueError`` for an invalid glob.
    """
    pattern = glob_pattern(params["matchGlob"])
    query = {key: params[key] for key in _UPSTREAM if key in params}
    selected: list[dict[str, Any]] = []
    while True:
        status, body = ask(f"{path}?{urlencode({**query, 'maxResults': MAX_PAGE_SIZE})}")
        if status != 200:
            return None
        page = json.loads(body)
        selected += [item for item in page.get("items", []) if pattern.fullmatch(item["name"])]
        if not page.get("nextPageToken"):
            break
        query["pageToken"] = page["nextPageToken"]
    return ListingIndex(selected).page({key: value for key, value in params.items() if key != "matchGlob"})
