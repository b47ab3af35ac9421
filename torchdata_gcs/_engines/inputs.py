"""A job's inputs expanded into the objects they name: prefixes, object names, globs and masks, listed
in turn (or shared through a manifest), each input required to name at least one object.

An input that names nothing is almost always a typo (``*.jpeg`` for ``*.jpg``, a misspelt prefix), and an
empty or short epoch is a poor way to learn of it: it raises ``NotFoundError`` naming the input, unless
the caller allows empty inputs or asked to skip missing objects.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

from .._ops.checksums import ObjectInfo
from .._ops.client import Client
from .._ops.paging import ITEM_FIELDS, NAME_FIELDS
from .._ops.patterns import NameFilter, has_magic, server_glob
from .._ops.urls import brief, format_url, parse_url
from ..errors import InvalidURIError, MissingObjectWarning, NotFoundError
from .job_listing import job_size, list_for_job
from .listing import list_objects
from .parallel_listing import ListingStats
from .resume import check_listing_position
from .shared_listing import Entry, SharedListing

__all__ = ["list_inputs"]


class _Matches:
    """Checks that each input named at least one object, once per input."""

    def __init__(
        self, inputs: Sequence[str], masks: Sequence[str], allow_empty: bool, skip_missing: bool, stats: ListingStats
    ) -> None:
        self.inputs, self.masks = inputs, [] if "" in masks else list(masks)
        self.allow_empty, self.skip_missing, self.stats = allow_empty, skip_missing, stats
        self.checked: set[int] = set()

    def done(
        self, index: int, kept: int, listed: int | None = None, example: str | None = None, narrowed: str | None = None
    ) -> None:
        """Input ``index`` was listed whole: ``kept`` objects passed its glob and masks, of ``listed``
        (``None``: not known, as when read from a manifest); ``example`` is the first name listed;
        ``narrowed``: the ``matchGlob`` GCS was asked to select names with."""
        self.checked.add(index)
        if kept:
            return
        url = self.inputs[index]
        _, name = parse_url(url)
        names_an_object = bool(name) and not name.endswith("/") and not has_magic(name)
        if names_an_object and not listed and (self.skip_missing or self.allow_empty):
            if self.skip_missing:
                self.stats.missing += 1
                warnings.warn(f"skipping {url}: no such object", MissingObjectWarning, stacklevel=2)
            return
        if not self.allow_empty:
            raise NotFoundError(self._explain(url, name, names_an_object, listed, example, narrowed), url=url)

    def finish(self, kept: Counter[int]) -> None:
        """Check the inputs not checked as they were listed, from the objects each kept."""
        for index in range(len(self.inputs)):
            if index not in self.checked:
                self.done(index, kept[index])

    def _explain(
        self, url: str, name: str, names_an_object: bool, listed: int | None, example: str | None, narrowed: str | None
    ) -> str:
        masks = f" with masks {self.masks!r}" if self.masks else ""
        hint = " (allow_empty=True accepts an input that matches nothing)"
        if narrowed is not None and listed == 0:
            first = f" (the first name there: {brief(example)})"
            return f"no object matches {url}{masks}: GCS lists none that its glob {narrowed!r} selects{first}{hint}"
        if listed:
            return f"no object matches {url}{masks}: {listed:,} listed, none kept (the first: {brief(example)}){hint}"
        if listed is None:
            return f"no object matches {url}{masks} in the shared listing{hint}"
        if names_an_object:
            return f"{url} does not exist: no object of that name, and none under {url}/ (skip_missing=True skips it)"
        root = NameFilter.of(name).root
        where = format_url(parse_url(url)[0], root)
        return f"no object matches {url}{masks}: there is no object under {where}{hint}"


def _first_name(client: Client, bucket: str, prefix: str) -> str | None:
    """The URL of the first object under ``prefix``, or ``None`` if there is none."""
    page = client.list_page(
        bucket, {"prefix": prefix, "maxResults": 1, "fields": "items(name)"}, url=format_url(bucket, prefix)
    )
    return format_url(bucket, page["items"][0]["name"]) if page.get("items") else None


def _selected_by(inputs: Sequence[str], masks: Sequence[str]) -> Callable[[int, str], bool]:
    """Whether listing ``inputs[index]`` could yield ``url``: in that input's bucket, the object it names
    or one under its prefix, kept by its glob and masks (what a shared manifest's entries must be)."""
    scopes = []
    for source_url in inputs:
        bucket, name = parse_url(source_url)
        keep = NameFilter.of(name, masks)
        scopes.append((bucket, None if keep.glob else name, keep))

    def selects(index: int, url: str) -> bool:
        try:
            bucket, name = parse_url(url, allow_prefix=False)
        except InvalidURIError:
            return False
        source_bucket, exact, keep = scopes[index]
        return bucket == source_bucket and (name == exact or name.startswith(keep.root)) and keep(name)

    return selects


def list_inputs(
    client: Client,
    inputs: list[str],
    masks: Sequence[str],
    *,
    with_info: bool,
    page_size: int,
    concurrency: int,
    stats: ListingStats,
    manifest: str | None = None,
    after: tuple[int, str] | None = None,
    allow_empty: bool = False,
    skip_missing: bool = False,
    once: bool = False,
) -> Iterator[list[Entry]]:
    """List every input URL in turn (from position ``after`` on), in batches of entries, through the
    shared ``manifest`` folder if one is given (entries then always carry their metadata); with ``once``
    and no manifest, where a process group of several ranks is initialized, rank 0 lists for every rank
    (see :func:`list_for_job`; every rank must then call this at the same point).

    An input is a prefix (``gs://b/dir/``, ``gs://b``), an object name that is also a folder
    (``gs://b/data``: the object, then everything under ``data/``) or a glob (``gs://b/dir/*.bin``);
    ``masks`` are kept as :class:`NameFilter` reads them. An input that keeps no object raises
    ``NotFoundError`` naming it, unless ``allow_empty``; a missing named object is skipped with a
    ``MissingObjectWarning`` and counted in ``stats.missing`` with ``skip_missing``. A position ``after``
    that its input would not list raises ``ResumeError``.
    """
    for url in inputs:
        parse_url(url)
    if after is not None:
        check_listing_position(after, inputs)
    matches = _Matches(inputs, masks, allow_empty, skip_missing, stats)
    keep_info = with_info or manifest is not None

    def list_from(start: tuple[int, str] | None) -> Iterator[list[Entry]]:
        for index, source_url in enumerate(inputs):
            if start is not None and index < start[0]:
                continue
            bucket, name = parse_url(source_url)
            base = f"gs://{bucket}/"
            keep = NameFilter.of(name, masks)
            narrowed = server_glob(keep, name, masks)  # fewer names sent; ``keep`` still decides
            resume_name = parse_url(start[1])[1] if start is not None and index == start[0] else None
            listed, kept, example = 0, 0, None
            select = None if keep.keeps_all else keep  # a call per name costs as much as the rest of its way
            for batch in list_objects(
                client,
                bucket,
                keep.root if keep.glob else name,
                page_size,
                concurrency,
                stats,
                resume_name,
                narrowed,
                item_fields=ITEM_FIELDS if keep_info else NAME_FIELDS,
            ):
                entries: list[Entry] = [
                    (index, base + resource["name"], ObjectInfo.from_json(resource) if keep_info else None)
                    for resource in batch
                    if select is None or select(resource["name"])
                ]
                if batch and example is None:
                    example = base + batch[0]["name"]
                listed, kept = listed + len(batch), kept + len(entries)
                yield entries
            if resume_name is None:  # a resumed input may rightly have nothing left
                if narrowed is not None and not listed and not allow_empty:  # one name, to show what is there
                    example = _first_name(client, bucket, keep.root)
                    narrowed = narrowed if example is not None else None
                matches.done(index, kept, listed, example, narrowed)

    if manifest is None and once and job_size() > 1:
        request = {"inputs": inputs, "masks": matches.masks, "with_info": with_info}
        request.update(allow_empty=allow_empty, skip_missing=skip_missing)
        entries = list_for_job(request, lambda: list_from(None), stats)
        yield entries if after is None else [entry for entry in entries if (entry[0], entry[1]) > after]
        return
    if manifest is None:
        yield from list_from(after)
        return
    kept: Counter[int] = Counter()
    shared = SharedListing(client, manifest, inputs, list(masks), _selected_by(inputs, masks))
    for batch in shared.entries(lambda: list_from(None)):
        kept.update(index for index, _, _ in batch)
        yield batch if after is None else [entry for entry in batch if (entry[0], entry[1]) > after]
    matches.finish(kept)  # a manifest read, not listed here: checked from its entries


def listed_objects(client: Client, inputs: str | Sequence[str], masks: Sequence[str]) -> list[tuple[str, ObjectInfo]]:
    """Every object ``inputs`` names (one URL or several) that ``masks`` keep, with its metadata, listed
    on this process alone (see :func:`list_inputs`)."""
    urls = [inputs] if isinstance(inputs, str) else list(inputs)
    batches = list_inputs(client, urls, masks, with_info=True, page_size=1000, concurrency=8, stats=ListingStats())
    return [(url, info) for batch in batches for _, url, info in batch if info is not None]
