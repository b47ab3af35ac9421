"""The safetensors format (an 8-byte little-endian header length, a JSON header, then the tensors' bytes)
read from GCS straight into tensor memory, and written through the parallel object writer.

A load reads the header by a ranged GET whose answer names the version (generation, size, crc32c), then
the data region as concurrent ranges pinned to that generation into one allocation that the tensors
view; the crc32c of the whole file is checked before any tensor is handed out."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import struct
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from .._ops.checksums import ObjectInfo, check_crc32c, crc32c_base64, crc32c_of_concatenation
from .._ops.client import Client
from .._ops.paging import ITEM_FIELDS
from .._ops.reads import read_ranges_into, read_version_start
from .._ops.urls import format_url, parse_url
from .._transport.context import RequestContext
from .._transport.deadline import call_deadline
from .._transport.loop import run
from .._transport.retry import reread_while_damaged_async
from ..config import WriteConfig
from ..errors import GCSError, IntegrityError, NotFoundError
from .listing import list_objects
from .local_cache import LocalCache, read_through
from .node_fetch import fetch_once_per_machine
from .ranges import read_into, read_into_buffer
from .serializer_errors import library_errors_first
from .upload import new_writer

__all__ = [
    "HEADER_GUESS",
    "MAX_HEADER",
    "MAX_INDEX",
    "Entry",
    "check_input",
    "decode",
    "encode",
    "load",
    "load_many",
    "load_once_per_machine",
    "merge_files",
    "model_files",
    "index_files",
    "parse_header",
    "read_index",
    "save",
    "tensors_of",
    "view_file",
    "write",
]

MAX_HEADER = 100_000_000
"""The longest header the format allows, as safetensors enforces it: a longer one is refused before it is read."""

MAX_INDEX = 32 << 20
"""The largest sharded checkpoint index read (the largest models' indexes hold a few MiB of names)."""

HEADER_GUESS = 1 << 20
"""How many bytes the first read asks for: the header of nearly every file, and more only if it is longer."""

_DTYPES = {
    name: getattr(torch, attribute)
    for name, attribute in {
        "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32",
        "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16", "BF16": "bfloat16",
        "F32": "float32", "F64": "float64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
        "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz", "C64": "complex64",
    }.items()
    if hasattr(torch, attribute)
}  # fmt: skip
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}

Entry = tuple[str, torch.dtype, list[int], int, int]
"""One tensor of a header: name, dtype, shape, and its ``[begin, end)`` in the data region."""


def parse_header(url: str, raw: bytes | memoryview, data_size: int) -> tuple[list[Entry], dict[str, str] | None]:
    """The tensors and metadata of a JSON header, checked to tile a data region of ``data_size`` bytes
    exactly; ``IntegrityError`` naming ``url`` for anything else."""

    def bad(why: str) -> IntegrityError:
        return IntegrityError(f"{url}: not a safetensors file: {why}", url=url)

    try:
        header = json.loads(bytes(raw))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"the header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise bad("__metadata__ is not a map of strings")
    entries: list[Entry] = []
    for name, spec in header.items():
        try:
            dtype, shape, (begin, end) = _DTYPES[spec["dtype"]], spec["shape"], spec["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise bad(f"tensor {name!r} has no known dtype, shape and data_offsets: {spec!r}") from None
        if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in (*shape, begin, end))):
            raise bad(f"tensor {name!r} has a shape or offsets that are not sizes: {spec!r}")
        needed = math.prod(shape) * dtype.itemsize
        if end - begin != needed:
            raise bad(f"tensor {name!r} spans {end - begin} bytes, its shape and dtype need {needed}")
        entries.append((name, dtype, shape, begin, end))
    reached = 0
    for name, _, _, begin, end in sorted(entries, key=lambda entry: (entry[3], entry[4])):
        if begin != reached:
            raise bad(f"tensor {name!r} starts at byte {begin} of the data, where {reached} was expected")
        reached = end
    if reached != data_size:
        raise bad(f"the tensors cover {reached} bytes of a {data_size}-byte data region")
    return entries, metadata


def _header_size(url: str, first: bytes | memoryview, size: int) -> int:
    """Where the data region starts, from the file's first 8 bytes and its size."""
    if size < 8:
        raise IntegrityError(f"{url}: not a safetensors file: {size} bytes, shorter than the header length", url=url)
    (length,) = struct.unpack("<Q", first[:8])
    if length > MAX_HEADER or 8 + length > size:
        json_hint = " (it starts like JSON: a sharded checkpoint's index is read with load_sharded)"
        raise IntegrityError(
            f"{url}: not a safetensors file: a {length}-byte header in a {size}-byte file, where the format"
            f" allows at most {MAX_HEADER} bytes{json_hint if bytes(first[:1]) == b'{' else ''}",
            url=url,
        )
    return 8 + length


def tensors_of(entries: list[Entry], data: torch.Tensor) -> dict[str, torch.Tensor]:
    """The tensors, in header order, as views of ``data`` (the uint8 data region); a tensor not aligned
    to its dtype in it gets a copy of its own."""
    tensors = {}
    for name, dtype, shape, begin, end in entries:
        piece = data[begin:end]
        if (data.storage_offset() + begin) % dtype.itemsize:
            piece = piece.clone()
        tensors[name] = piece.view(dtype).reshape(shape)
    return tensors


async def _read_once(
    context: RequestContext, url: str, part_size: int
) -> tuple[dict[str, torch.Tensor], int, ObjectInfo]:
    """The file's tensors, the crc32c of all its bytes and the version read: the header's first read names
    the version (its answer's headers), then the rest of the header and the data region are read as
    concurrent ranges of that generation into one allocation (the first read's bytes past the header copied in)."""
    guess = memoryview(bytearray(HEADER_GUESS))
    try:
        info, crc = await read_version_start(context, url, guess)
    except GCSError as exc:
        if exc.status != 416:  # no byte 0: GCS's answer for an empty object
            raise
        info, crc = ObjectInfo(0, 0), 0
    first = guess[: info.size]
    pieces = [(crc, len(first))]
    start = _header_size(url, first, info.size)
    header = first[8:start]
    if start > len(first):
        rest = bytearray(start - len(first))
        pieces.append(
            (await read_ranges_into(context, url, info.generation, len(first), memoryview(rest), part_size), len(rest))
        )
        header = memoryview(bytes(first[8:]) + rest)
    entries, _ = parse_header(url, header, info.size - start)
    data = torch.empty(info.size - start, dtype=torch.uint8)
    target = _byte_view(data)
    have = max(0, len(first) - start)
    target[:have] = first[start:]
    if len(target) > have:
        crc = await read_ranges_into(context, url, info.generation, start + have, target[have:], part_size)
        pieces.append((crc, len(target) - have))
    return tensors_of(entries, data), crc32c_of_concatenation(pieces), info


async def _read_checked(context: RequestContext, url: str, client: Client) -> dict[str, torch.Tensor]:
    """The tensors of ``url``, once the crc32c of the whole file matches GCS's; bytes damaged on the way are
    read again, all of them (GCS keeps no checksum per range), as retries allow."""

    def check(read: tuple[dict[str, torch.Tensor], int, ObjectInfo]) -> dict[str, torch.Tensor]:
        tensors, crc, info = read
        check_crc32c(url, crc32c_base64(crc), {"GCS": info.crc32c})
        return tensors

    reading = functools.partial(_read_once, context, url, client.transfer.part_size)
    return await reread_while_damaged_async(reading, check, client.retry, url, client.stats.count_retry)


def load(url: str, client: Client, cache: LocalCache | None = None) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file at ``url``, checked; with a ``cache``, from it (or kept in it)."""
    if cache is None:
        return load_many([url], client)[0]
    with call_deadline(client.retry):
        info = _object_info(url, client)
        stored = read_through(
            cache, url, info, lambda view: read_into(view, url, info, client), client.stats, client.retry.deadline
        )
    return decode(stored)


def load_many(urls: list[str], client: Client) -> list[dict[str, torch.Tensor]]:
    """The tensors of each file, read concurrently, each checked."""
    with call_deadline(client.retry):
        return run(_load_all(client.context(), urls, client))


def _object_info(url: str, client: Client) -> ObjectInfo:
    bucket, name = parse_url(url, allow_prefix=False)
    resource = client.head(bucket, name, ITEM_FIELDS, missing_ok=False)
    assert resource is not None
    return ObjectInfo.from_json(resource)


async def _load_all(context: RequestContext, urls: list[str], client: Client) -> list[dict[str, torch.Tensor]]:
    """Every file read at once, each learning its version from its first answer (no metadata request)."""
    return list(await asyncio.gather(*(_read_checked(context, url, client) for url in urls)))


def check_input(tensors: Any, metadata: Any) -> None:
    """Refuse what ``safetensors.torch`` refuses to save, with its exception types: a file it could not
    read back (names or metadata that are not strings) is never written."""
    if not isinstance(tensors, Mapping):
        raise ValueError(f"expected a dict of [str, torch.Tensor], received {type(tensors)}")
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, received {name!r}")
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"key {name!r} is invalid: expected torch.Tensor, received {type(tensor)}")
        if tensor.layout != torch.strided:
            raise ValueError(f"tensor {name!r} is {tensor.layout}: safetensors holds dense tensors (use .to_dense())")
    if metadata is not None and not (
        isinstance(metadata, Mapping) and all(isinstance(item, str) for pair in metadata.items() for item in pair)
    ):
        raise TypeError(f"metadata must map str to str, received {metadata!r}")


def _layout(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None) -> tuple[bytes, list[str]]:
    """The header (padded with spaces to 8 bytes, so each tensor stays aligned) and the order the tensors
    follow it in: widest dtype first, then by name."""
    check_input(tensors, metadata)
    order = sorted(tensors, key=lambda name: (-tensors[name].dtype.itemsize, name))
    header: dict[str, Any] = {} if metadata is None else {"__metadata__": dict(metadata)}
    offset = 0
    for name in order:
        tensor = tensors[name]
        if tensor.dtype not in _NAMES:
            raise ValueError(f"tensor {name!r}: dtype {tensor.dtype} has no safetensors name")
        end = offset + tensor.numel() * tensor.dtype.itemsize
        header[name] = {"dtype": _NAMES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, end]}
        offset = end
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, order


def _byte_view(tensor: torch.Tensor) -> memoryview:
    """A writable view of a CPU ``uint8`` tensor's bytes, without a copy."""
    return memoryview(tensor.numpy())  # type: ignore[arg-type]  # numpy's stubs give arrays the buffer protocol on 3.12+ only


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes on the CPU, in C order, without a copy where it is already laid out so."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return _byte_view(flat.view(torch.uint8))


def _pieces(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None) -> Iterator[bytes | memoryview]:
    header, order = _layout(tensors, metadata)
    yield header
    for name in order:
        yield _bytes_of(tensors[name])


def encode(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None) -> bytes:
    """The whole file in memory."""
    return b"".join(_pieces(tensors, metadata))


def decode(data: bytes | memoryview) -> dict[str, torch.Tensor]:
    """The tensors of a whole file in memory (one copy of it, which they view)."""
    whole = torch.empty(len(data), dtype=torch.uint8)
    _byte_view(whole)[:] = data
    return view_file("<bytes>", whole)


def view_file(url: str, whole: torch.Tensor) -> dict[str, torch.Tensor]:
    """The tensors of a whole file held in ``whole`` (``uint8``), as views of it where aligned."""
    raw = _byte_view(whole)
    start = _header_size(url, raw, len(raw))
    entries, _ = parse_header(url, raw[8:start], len(raw) - start)
    return tensors_of(entries, whole[start:])


def load_once_per_machine(urls: list[str], client: Client, group: Any) -> list[dict[str, torch.Tensor]]:
    """The tensors of each file, fetched once per machine by the ranks of ``group`` into shared memory
    that they view (see :mod:`.node_fetch`)."""
    wholes = fetch_once_per_machine(urls, client, group)
    return [view_file(url, whole) for url, whole in zip(urls, wholes, strict=True)]


def save(
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None,
    url: str,
    client: Client,
    write: WriteConfig,
) -> int:
    """Write the file to ``url`` tensor by tensor through the parallel writer, published only on a clean
    finish; the published generation."""
    return _write(_pieces(tensors, metadata), url, client, write)


def read_index(url: str, client: Client) -> bytearray:
    """A sharded checkpoint's index, checked; an object larger than an index may be is refused unread."""
    with call_deadline(client.retry):
        info = _object_info(url, client)
        if info.size > MAX_INDEX:
            raise IntegrityError(
                f"{url}: not a safetensors index: {info.size} bytes, more than an index may hold ({MAX_INDEX});"
                " a single safetensors file is read with load_file",
                url=url,
            )
        return read_into_buffer(url, info, client)


def model_files(url: str, client: Client, index_name: str) -> tuple[list[str], dict[str, str] | None]:
    """The files of a model: the shards an index (``url`` ending in ``.json``) names beside it, with its
    ``weight_map``; or the ``index_name`` of the folder ``url`` if it holds one; else every ``.safetensors``
    file directly in it (no weight map). ``NotFoundError`` where there is none."""
    if not url.endswith(".json"):
        folder = url.rstrip("/") + "/"
        bucket, name = parse_url(folder, allow_prefix=True)
        names = [
            format_url(bucket, item["name"])
            for batch in list_objects(client, bucket, name, 1000, match_glob=f"{name}*")
            for item in batch
            if item["name"].endswith((".safetensors", f"/{index_name}"))
        ]
        if f"{folder}{index_name}" not in names:
            if not names:
                raise NotFoundError(f"{folder}: no safetensors files and no {index_name} in this folder", url=folder)
            return sorted(names), None
        url = f"{folder}{index_name}"
    return index_files(url, client)


def index_files(url: str, client: Client) -> tuple[list[str], dict[str, str]]:
    """The shards the index at ``url`` names beside it, and its ``weight_map``."""
    index = read_index(url, client)
    try:
        weight_map = json.loads(index)["weight_map"]
        if not all(isinstance(key, str) and isinstance(value, str) for key, value in weight_map.items()):
            raise TypeError("weight_map must map tensor names to file names")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise IntegrityError(
            f"{url}: not a safetensors index ({type(exc).__name__}: {str(exc)[:200]}); a single safetensors"
            " file is read with load_file",
            url=url,
        ) from None
    folder = url.rpartition("/")[0]
    return [f"{folder}/{shard}" for shard in sorted(set(weight_map.values()))], weight_map


def merge_files(
    urls: list[str], loaded: list[dict[str, torch.Tensor]], weight_map: dict[str, str] | None, where: str
) -> dict[str, torch.Tensor]:
    """One state dict of the files' tensors, each where ``weight_map`` says it is (if there is one): a
    tensor missing from its file, in a file the map does not name it in, or in two files, is an error."""
    tensors: dict[str, torch.Tensor] = {}
    for url, file_tensors in zip(urls, loaded, strict=True):
        shard = url.rpartition("/")[2]
        for name, tensor in file_tensors.items():
            if name in tensors:
                raise IntegrityError(f"{url}: tensor {name!r} is also in another file of {where}", url=url)
            if weight_map is not None and weight_map.get(name) != shard:
                said = "names no such tensor" if name not in weight_map else f"puts it in {weight_map[name]}"
                raise IntegrityError(f"{url}: holds tensor {name!r}, where the index of {where} {said}", url=url)
            tensors[name] = tensor
    missing = sorted((weight_map or {}).keys() - tensors.keys())
    if missing:
        assert weight_map is not None
        name = missing[0]
        raise IntegrityError(
            f"{where}: tensor {name!r} is not in {weight_map[name]}, where the index puts it"
            f" ({len(missing)} missing in all)",
            url=where,
        )
    return tensors


def write(data: bytes, url: str, client: Client, config: WriteConfig) -> int:
    """Write ``data`` to ``url``; the published generation."""
    return _write([data], url, client, config)


def _write(pieces: Iterable[bytes | memoryview], url: str, client: Client, config: WriteConfig) -> int:
    with call_deadline(client.retry), new_writer(url, client, config) as writer, library_errors_first():
        for piece in pieces:
            writer.write(piece)
    assert writer.generation is not None
    return writer.generation
