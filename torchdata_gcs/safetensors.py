"""Model weights in the safetensors format on GCS, as ``safetensors.torch`` reads and writes them locally.

``load_file`` reads the header, then the data region as concurrent ranges of one object version
straight into one allocation that the tensors view (memory grows by about the file's size), and checks
the crc32c of the whole file before returning; a range cut on the way is resumed alone. ``save_file``
streams the header and each tensor's bytes through the parallel writer and publishes only on success.
``load`` and ``save`` are the format alone, on bytes, so code can swap ``safetensors.torch`` for this
module. Sharded checkpoints follow Hugging Face's names (``model.safetensors.index.json``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from ._engines import tensor_files
from ._engines.local_cache import LocalCache, check_cache
from ._ops.client import Client, GCSClient
from ._ops.urls import parse_url
from .config import ClientConfig, RetryConfig, TransferConfig, WriteConfig, parse_size

__all__ = ["INDEX_NAME", "load", "load_file", "load_files", "load_sharded", "save", "save_file", "save_sharded"]

INDEX_NAME = "model.safetensors.index.json"
"""The index of a sharded checkpoint, as Hugging Face names it."""


def load(data: bytes) -> dict[str, torch.Tensor]:
    """The tensors of a whole safetensors file held in ``data``, as ``safetensors.torch.load``.

    Raises:
        IntegrityError: ``data`` is not a safetensors file (a ``ValueError`` in ``safetensors``).

    Examples:
        >>> import torch
        >>> from torchdata_gcs import safetensors
        >>> safetensors.load(safetensors.save({"w": torch.arange(3.0)}))
        {'w': tensor([0., 1., 2.])}
    """
    return tensor_files.decode(data)


def save(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """The safetensors file of ``tensors`` (with string ``metadata``), as ``safetensors.torch.save``."""
    return tensor_files.encode(tensors, metadata)


def load_file(
    url: str,
    device: str | int | torch.device = "cpu",
    *,
    process_group: dist.ProcessGroup | None = None,
    client: GCSClient | ClientConfig | None = None,
    transfer: TransferConfig | None = None,
    retry: RetryConfig | None = None,
    cache: LocalCache | None = None,
) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file at ``url``, as ``safetensors.torch.load_file``.

    The data region is read as concurrent ranges of ``transfer.part_size``, all of the version first
    seen, into one CPU allocation that the tensors share (a tensor not aligned to its dtype gets its
    own copy). Nothing is returned unless the file's crc32c matches GCS's. For another ``device``
    (``"cuda"``, ``"cuda:1"``, ``0``) the tensors are loaded to the CPU, then moved with ``.to(device)``;
    a device this process cannot use fails with torch's error before anything is read. With a ``cache`` (a
    ``LocalCache``), the file comes from this machine's disk if its version is there, else it is downloaded
    once for every process of the machine and kept.

    With a ``process_group`` (a ``torch.distributed`` group; every rank of it must call this, and no other
    rank is waited for), the ranks of the group on one machine fetch the file once between them, each
    its share of the ranges, into one shared-memory segment that every one of them maps (see
    :func:`load_files`, which says what memory that holds and when it is released).

    Raises:
        NotFoundError: no such object, or no such bucket.
        IntegrityError: not a safetensors file, or its bytes do not check out.
        RankFailedError: with ``process_group``, another rank failed or stopped during the load.

    Examples:
        >>> import torch
        >>> from torchdata_gcs import safetensors, testing
        >>> with testing.Emulator() as emulator:
        ...     emulator.create_bucket("weights")
        ...     url, config = "gs://weights/m.safetensors", emulator.client_config
        ...     _ = safetensors.save_file({"w": torch.ones(2)}, url, client=config)
        ...     safetensors.load_file(url, client=config)
        {'w': tensor([1., 1.])}
    """
    target = _usable(device)
    gcs = Client(client, retry, transfer=transfer)
    if _shared(process_group, cache):
        return _to(tensor_files.load_once_per_machine([url], gcs, process_group)[0], target)
    return _to(tensor_files.load(url, gcs, check_cache(cache)), target)


def load_files(
    url: str,
    device: str | int | torch.device = "cpu",
    *,
    process_group: dist.ProcessGroup | None = None,
    client: GCSClient | ClientConfig | None = None,
    transfer: TransferConfig | None = None,
    retry: RetryConfig | None = None,
) -> dict[str, torch.Tensor]:
    """One state dict of a model held in several safetensors files: ``url`` is its index
    (``.../model.safetensors.index.json``, as Hugging Face writes it) or its folder (``gs://b/llm/``: its
    index if it holds one, else every ``.safetensors`` file directly in it).

    Every file is read at once, each as :func:`load_file` reads one, straight into the memory its tensors
    view: besides the tensors, a load holds at most the first MiB of each file. Each tensor must be where
    the index's ``weight_map`` puts it, and in one file only.

    With a ``process_group`` (a ``torch.distributed`` group: every rank of it must call this with the same
    ``url``; ranks outside it are not waited for), the ranks of the group on one machine fetch the files
    once between them: the first rank there reads the start of each file and makes one segment in
    ``/dev/shm`` for all of them, each rank reads its share of the ranges into it, and all check the
    crc32c. Every rank's tensors then view that one segment (zero-copy; a tensor not aligned to its dtype
    gets a copy): the machine holds the model once, not once per rank. The segment has no name once the
    load returns (nor after a failure), so nothing is left behind; its memory is released when the last
    tensor viewing it, on any rank of the machine, is gone (a rank that keeps one tensor keeps the whole
    segment mapped). Ranks on several machines fetch once per machine. A rank that fails or stops makes
    every other rank raise within the group's timeout.

    Raises:
        NotFoundError: no index, shard or safetensors file where ``url`` says.
        IntegrityError: a file that is not what it says, or a tensor missing from, or extra in, the
            file the index names.
        RankFailedError: with ``process_group``, another rank failed or stopped during the load.

    Examples:
        >>> import torch
        >>> from torchdata_gcs import safetensors, testing
        >>> with testing.Emulator() as emulator:
        ...     emulator.create_bucket("weights")
        ...     config = emulator.client_config
        ...     state = {"a": torch.ones(2), "b": torch.zeros(1)}
        ...     _ = safetensors.save_sharded(state, "gs://weights/llm/", 8, client=config)
        ...     safetensors.load_files("gs://weights/llm/", client=config)
        {'a': tensor([1., 1.]), 'b': tensor([0.])}
    """
    target = _usable(device)
    gcs = Client(client, retry, transfer=transfer)
    return _load_model(url, tensor_files.model_files(url, gcs, INDEX_NAME), gcs, target, process_group)


def _load_model(
    url: str,
    files: tuple[list[str], dict[str, str] | None],
    gcs: Client,
    target: torch.device,
    process_group: dist.ProcessGroup | None,
) -> dict[str, torch.Tensor]:
    urls, weight_map = files
    if _shared(process_group, None):
        loaded = tensor_files.load_once_per_machine(urls, gcs, process_group)
    else:
        loaded = tensor_files.load_many(urls, gcs)
    return _to(tensor_files.merge_files(urls, loaded, weight_map, url), target)


def save_file(
    tensors: Mapping[str, torch.Tensor],
    url: str,
    metadata: Mapping[str, str] | None = None,
    *,
    client: GCSClient | ClientConfig | None = None,
    retry: RetryConfig | None = None,
    write: WriteConfig | None = None,
) -> int:
    """Write ``tensors`` as a safetensors file to ``url``, as ``safetensors.torch.save_file``; returns
    the published generation.

    The header, then each tensor's bytes, go through the parallel writer (``write``'s part size, parts in
    flight and strategy; its compression is not used: the file must stay readable by range). Memory
    holds the parts in flight, never a copy of all the tensors; the object is published only if every
    part was written. Saving over an existing object replaces it, as a local file is replaced.

    Raises:
        TypeError: a name, metadata key or value that is not ``str`` (as ``safetensors.torch``).
        ValueError: a value that is not a dense tensor, a dtype the format has no name for, or
            ``write.compression`` set; in each case nothing is written.
    """
    write = WriteConfig() if write is None else write
    if write.compression is not None:
        raise ValueError("save_file: a safetensors file is read by ranges; save it without compression")
    return tensor_files.save(tensors, metadata, url, Client(client, retry), write)


def load_sharded(
    url: str,
    device: str | int | torch.device = "cpu",
    *,
    client: GCSClient | ClientConfig | None = None,
    transfer: TransferConfig | None = None,
    retry: RetryConfig | None = None,
) -> dict[str, torch.Tensor]:
    """The tensors of a sharded checkpoint whose index is ``url``: :func:`load_files` given an index.

    Raises:
        NotFoundError: the index or a shard is missing.
        IntegrityError: the index or a shard is not what it says (an object of more than 32 MiB is no
            index: it is refused unread).
    """
    target = _usable(device)
    gcs = Client(client, retry, transfer=transfer)
    return _load_model(url, tensor_files.index_files(url, gcs), gcs, target, None)


def save_sharded(
    tensors: Mapping[str, torch.Tensor],
    url_prefix: str,
    max_shard_size: int | str = 5 * 10**9,
    metadata: Mapping[str, str] | None = None,
    *,
    client: GCSClient | ClientConfig | None = None,
    retry: RetryConfig | None = None,
    write: WriteConfig | None = None,
) -> str:
    """Write ``tensors`` as shards of at most ``max_shard_size`` bytes of tensor data (a number, or a size
    as Hugging Face writes it: ``"5GB"``, ``"500MiB"``; a larger tensor
    gets a shard of its own) under ``url_prefix`` (a folder), named as Hugging Face names them
    (``model-00001-of-00002.safetensors``), then the index; returns the index's URL, for
    :func:`load_sharded`. The index is written last, so a reader never finds one naming missing shards.

    Examples:
        >>> import torch
        >>> from torchdata_gcs import safetensors, testing
        >>> with testing.Emulator() as emulator:
        ...     emulator.create_bucket("weights")
        ...     state = {"a": torch.ones(2), "b": torch.zeros(3)}
        ...     index = safetensors.save_sharded(state, "gs://weights/llm/", 8, client=emulator.client_config)
        ...     print(index)
        ...     safetensors.load_sharded(index, client=emulator.client_config)
        gs://weights/llm/model.safetensors.index.json
        {'a': tensor([1., 1.]), 'b': tensor([0., 0., 0.])}
    """
    parse_url(url_prefix, allow_prefix=True)
    tensor_files.check_input(tensors, metadata)
    max_shard_size = parse_size("max_shard_size", max_shard_size)
    groups: list[list[str]] = [[]]
    filled = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        if groups[-1] and filled + size > max_shard_size:
            groups.append([])
            filled = 0
        groups[-1].append(name)
        filled += size
    folder = url_prefix.rstrip("/")
    gcs, write = Client(client, retry), WriteConfig() if write is None else write
    weight_map = {}
    for number, names in enumerate(groups, 1):
        shard = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        tensor_files.save({name: tensors[name] for name in names}, metadata, f"{folder}/{shard}", gcs, write)
        weight_map.update(dict.fromkeys(names, shard))
    total = sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
    index = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2).encode()
    tensor_files.write(index, f"{folder}/{INDEX_NAME}", gcs, write)
    return f"{folder}/{INDEX_NAME}"


def _shared(process_group: Any, cache: LocalCache | None) -> bool:
    """Whether a load goes through ``process_group`` (one of several ranks); with a cache it cannot."""
    if process_group is None:
        return False
    if cache is not None:
        raise ValueError(
            "load_file: give process_group or cache, not both (a cache already downloads once per machine;"
            " process_group also shares the memory)"
        )
    if not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(f"process_group: expected a torch.distributed ProcessGroup, got {type(process_group).__name__}")
    return dist.get_world_size(process_group) > 1


def _usable(device: str | int | torch.device) -> torch.device:
    """``device``, once torch can allocate on it: a missing GPU fails before the download, not after."""
    target = torch.device(device)
    if target.type != "cpu":
        torch.empty(0, device=target)
    return target


def _to(tensors: dict[str, Any], device: torch.device) -> dict[str, torch.Tensor]:
    if device.type == "cpu":
        return tensors
    return {name: tensor.to(device) for name, tensor in tensors.items()}
