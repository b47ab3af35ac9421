"""Changes to stored objects, made by GCS: metadata set in place (``setxattrs``), objects copied and moved
(``cp_file``, ``mv``) and joined by one compose (``merge``); no bytes pass through this process."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from fsspec.asyn import sync, sync_wrapper
from fsspec.utils import other_paths

from .._ops.attributes import ObjectAttributes, fixed_fields, user_metadata
from .._ops.checksums import crc32c_base64, crc32c_of_concatenation, crc32c_value
from .._ops.objects import (
    MAX_SOURCES,
    compose_object,
    delete_object,
    live_generation,
    object_resource,
    patch_object,
    rewrite_object,
)
from .._ops.patterns import has_magic
from ..errors import NotFoundError, PreconditionFailedError
from .calls import in_bulk_on_io_loop, on_io_loop
from .files import Files
from .paths import folders_of

__all__ = ["Changes"]


class Changes(Files):
    """Setting metadata, copying, moving and merging objects."""

    @on_io_loop
    async def _setxattrs(
        self,
        path: str,
        content_type: str | None = None,
        content_encoding: str | None = None,
        fixed_key_metadata: dict[str, str | None] | None = None,
        **metadata: str | None,
    ) -> dict[str, str]:
        """Change an object's metadata in place, as gcsfs's ``setxattrs``: the user metadata ``metadata``
        (a key given ``None`` is removed; others are kept), ``content_type``, ``content_encoding`` and the
        ``fixed_key_metadata`` (``cache_control``, ``content_disposition``, ``content_encoding``,
        ``content_language``, ``custom_time``; ``None`` clears one). Returns the user metadata after it.

        One PATCH, conditional on the generation and metageneration read first, so retried safely; an object
        changed meanwhile is read again and patched anew."""
        bucket, name, _ = self._object(path)
        patch: dict[str, Any] = {"metadata": user_metadata(metadata, removable=True)}
        patch.update(fixed_fields(fixed_key_metadata, removable=True))
        if content_encoding is not None:
            patch.update(fixed_fields({"content_encoding": content_encoding}))
        if content_type is not None:
            patch["contentType"] = ObjectAttributes.of(content_type).content_type
        try:
            resource = await patch_object(self._context(), bucket, name, patch)
        finally:  # cached listings describe the object's metadata; a failed request may have patched it
            self._drop_listings([path], written=True)
        after: dict[str, str] = resource.get("metadata", {})
        return after

    setxattrs = sync_wrapper(_setxattrs)

    @on_io_loop
    async def _cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Copy one object server-side (the version a ``name#<generation>`` source names, if it does); a
        directory (met by a recursive ``copy`` or ``mv``) has nothing to copy but its objects, which are copied
        on their own, as fsspec's filesystems make a directory there."""
        source, destination = self._object(path1, version=True), self._object(path2)
        generation = self._split_version(path1)[2]
        try:
            await rewrite_object(
                self._context(),
                source[:2],
                destination[:2],
                source_generation=generation,
                kms_key_name=self.kms_key_name,
            )
        except NotFoundError:
            if generation is not None or not await self._is_directory(self._context(), *source[:2]):
                raise
        finally:
            self._drop_listings([path2], written=True)

    @on_io_loop
    async def _mv_file(self, path1: str, path2: str) -> None:
        """Move one object: copy its live version in GCS, then delete the source if it is still that version
        (``ifGenerationMatch``: in a bucket with object versioning it stays as a noncurrent version, as
        gcsfs leaves it). A source replaced in between is not deleted: its new bytes were not moved."""
        (bucket, name, url), destination = self._object(path1), self._object(path2)
        context = self._context()
        generation = await live_generation(context, bucket, name)
        if not generation:
            raise NotFoundError(f"{url}: no such object", url=url)
        try:
            copied = (bucket, name)
            await rewrite_object(
                context, copied, destination[:2], source_generation=generation, kms_key_name=self.kms_key_name
            )
            with contextlib.suppress(PreconditionFailedError):  # replaced since: the newer object stays
                await delete_object(context, bucket, name, if_generation_match=generation)
        finally:
            self._drop_listings([path1, path2])

    mv_file = sync_wrapper(_mv_file)

    @in_bulk_on_io_loop
    async def _mv(
        self,
        path1: Any,
        path2: Any,
        recursive: bool = False,
        maxdepth: int | None = None,
        batch_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Move each object on its own (:meth:`_mv_file`: a rewrite in GCS, then a delete of the generation
        copied), as gcsfs moves them, at most ``batch_size`` at once (else ``TransferConfig.max_in_flight``),
        sources and destinations paired as ``copy`` pairs them. A directory named without ``recursive=True``
        raises ``IsADirectoryError`` (gcsfs moves nothing); those a glob matches are skipped. Every object is
        tried; the first failure is raised after, but a directory's own path, which has no object to move, is no
        failure. Any other keyword raises ``TypeError`` naming it."""
        if kwargs:
            raise TypeError(f"mv got arguments it does not take: {', '.join(sorted(kwargs))}")
        if path1 == path2:
            return
        if isinstance(path1, list) and isinstance(path2, list):
            sources, targets = [self._strip_protocol(p) for p in path1], [self._strip_protocol(p) for p in path2]
        else:
            sources = await self._expand_path(path1, recursive=recursive, maxdepth=maxdepth)
            named = isinstance(path1, str)
            if named and (not recursive or maxdepth is not None):  # directories are moved only with their tree
                kept = [p for p in sources if not p.endswith("/") and not await self._isdir(p)]
                if not kept and not has_magic(path1) and sources:
                    raise IsADirectoryError(f"{path1} is a directory: move it with recursive=True")
                sources = kept
            if not sources:
                return
            into = isinstance(path2, str) and (path2.endswith("/") or await self._isdir(path2))
            # as fsspec's copy: a glob's one object, or a path without "/" moved into a directory, keeps its name
            keep_name = named and (
                (has_magic(path1) and len(sources) == 1) or (not has_magic(path1) and into and not path1.endswith("/"))
            )
            targets = other_paths(sources, path2, exists=keep_name, flatten=not named)
        if len(sources) != len(targets):
            raise ValueError(f"mv got {len(sources)} sources but {len(targets)} destinations")
        slots = asyncio.Semaphore(batch_size or self.client.transfer.max_in_flight)

        async def move(source: str, target: str) -> None:
            async with slots:
                await self._mv_file(source, target)

        outcomes = await asyncio.gather(
            *(move(s, t) for s, t in zip(sources, targets, strict=True)), return_exceptions=True
        )
        failed = [
            (s, outcome) for s, outcome in zip(sources, outcomes, strict=True) if isinstance(outcome, BaseException)
        ]
        holding = {folder for source in sources for folder in folders_of(source)} if failed else set()
        for source, outcome in failed:
            if recursive and isinstance(outcome, FileNotFoundError) and source.rstrip("/") in holding:
                continue  # a directory's own path, listed beside its objects
            raise outcome

    mv = sync_wrapper(_mv)

    def merge(self, path: str, paths: list[str]) -> None:
        """Write ``path`` as the concatenation of the objects ``paths``, in their order, by one compose in
        GCS: no bytes pass through this process. The sources must be in ``path``'s bucket and at most
        ``MAX_SOURCES`` (GCS's limit for one compose); an existing ``path`` is replaced.

        Examples:
            >>> from torchdata_gcs.fsspec import GCSFileSystem
            >>> from torchdata_gcs.testing import Emulator
            >>> with Emulator() as emulator:
            ...     emulator.create_bucket("demo")
            ...     fs = GCSFileSystem(client=emulator.client_config)
            ...     _ = fs.pipe({"demo/a": b"al", "demo/b": b"pha"})
            ...     fs.merge("demo/ab", ["demo/a", "demo/b"])
            ...     fs.cat("demo/ab")
            b'alpha'
        """
        sync(self.loop, self._merge, path, paths)

    @on_io_loop
    async def _merge(self, path: str, paths: list[str]) -> None:
        bucket, name, url = self._object(path)
        sources = [self._object(source) for source in paths]
        if not sources or len(sources) > MAX_SOURCES:
            raise ValueError(f"merge takes 1 to {MAX_SOURCES} objects (one GCS compose), got {len(sources)}")
        elsewhere = [source_url for source_bucket, _, source_url in sources if source_bucket != bucket]
        if elsewhere:
            raise ValueError(f"merge composes objects of {url}'s bucket only, not {elsewhere[0]}")
        context = self._context()
        found = await asyncio.gather(
            *(
                object_resource(context, bucket, source, "size,generation,crc32c", missing_ok=False)
                for _, source, _ in sources
            )
        )
        pieces = [(crc32c_value(resource["crc32c"]), int(resource["size"])) for resource in found if resource]
        attributes = self._attributes({}, path)
        try:
            await compose_object(
                context,
                bucket,
                name,
                [
                    (source, int(resource["generation"]))
                    for (_, source, _), resource in zip(sources, found, strict=True)
                    if resource
                ],
                if_generation_match=await live_generation(context, bucket, name),
                composite=(sum(size for _, size in pieces), crc32c_base64(crc32c_of_concatenation(pieces))),
                content_type=attributes.content_type,
                kms_key_name=attributes.kms_key_name,
            )
        finally:
            self._drop_listings([path], written=True)
