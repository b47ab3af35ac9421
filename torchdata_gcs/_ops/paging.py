"""Listing pages: how many items and which fields one holds, and following a listing from page to page, so
that a server going round in circles ends it with an error: GCS hands out each page token once per listing
and lists in name order, so every page moves past the last."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any, TypeVar

from ..errors import ListingError
from .urls import brief

__all__ = ["ITEM_FIELDS", "MAX_PAGE_SIZE", "NAME_FIELDS", "PageTrail"]

MAX_PAGE_SIZE = 1000
"""GCS never returns more items in one list page."""
ITEM_FIELDS = "name,size,generation,crc32c,storageClass"
"""The object fields a listing asks for (``fields=`` trims everything else from the answers); the
storage class tells which objects may be composed together."""
NAME_FIELDS = "name,size"
"""The object fields a listing of names alone asks for (the size tells a folder placeholder): a page of
them is about a third of one with :data:`ITEM_FIELDS`, and as much quicker to read."""

Token = TypeVar("Token", bound=Hashable)


class PageTrail:
    """The pages of one listing so far (one chain of page tokens from a first request), for ``url``.

    :meth:`follow` takes each page's entries and its token for the next page, and raises
    ``ListingError`` when the token was handed out before, or when the page names nothing new: no
    entry after the last one listed, no prefix not listed before (prefixes are only told apart from
    earlier ones: a page may name again one that an earlier page named). An empty page with a new token
    moves on: GCS sends those (a glob or a soft-delete listing may pass many names in one page).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.pages = 0
        self._tokens: set[Hashable] = set()
        self._last: str | None = None  # the greatest name listed so far
        self._at_last: set[tuple[str, str]] = set()  # the entries (versions) of that name
        self._prefixes: set[str] = set()

    def follow_json(self, page: dict[str, Any]) -> str | None:
        """:meth:`follow` for a JSON API list page (objects as ``(name, generation)``, when asked for)."""
        items = [(item["name"], str(item.get("generation", ""))) for item in page.get("items", [])]
        return self.follow(items, page.get("nextPageToken") or None, page.get("prefixes", []))

    def follow(
        self, entries: Iterable[tuple[str, str]], token: Token | None, prefixes: Iterable[str] = ()
    ) -> Token | None:
        """The token for the page after one naming ``entries`` (``(name, version)`` pairs, in name order)
        and ``prefixes``, whose answer gave ``token`` (``None``: the listing is complete)."""
        self.pages += 1
        entries, prefixes = list(entries), set(prefixes)
        if (entries or prefixes) and not (self._moves_on(entries) or prefixes - self._prefixes):
            raise ListingError(
                f"the listing of {self.url} makes no progress: page {self.pages} names only what earlier pages"
                f" listed (up to {brief(self._last)}); GCS never answers so, the listing is stopped",
                url=self.url,
            )
        self._prefixes |= prefixes
        for name, version in entries:
            if self._last is None or name > self._last:
                self._last, self._at_last = name, {(name, version)}
            elif name == self._last:
                self._at_last.add((name, version))
        if token is None:
            return None
        if token in self._tokens:
            raise ListingError(
                f"the listing of {self.url} makes no progress: page {self.pages} gave the page token"
                f" {brief(token)} a second time; GCS never does, the listing is stopped",
                url=self.url,
            )
        self._tokens.add(token)
        return token

    def _moves_on(self, entries: list[tuple[str, str]]) -> bool:
        """Whether ``entries`` name something after the last entry listed."""
        last = self._last
        return last is None or any(
            name > last or (name == last and (name, version) not in self._at_last) for name, version in entries
        )
