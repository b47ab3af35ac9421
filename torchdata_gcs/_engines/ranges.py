"""One object version read whole for a blocking caller: concurrent ranges straight into the caller's buffer,
checked against the object's crc32c without another pass, and read again while damaged."""

from __future__ import annotations

from .._ops.checksums import ObjectInfo, check_crc32c, crc32c_base64
from .._ops.client import Client
from .._ops.reads import read_ranges_into
from .._transport.loop import run
from .._transport.retry import reread_while_damaged

__all__ = ["read_into", "read_into_buffer"]


def read_into_buffer(url: str, info: ObjectInfo, client: Client) -> bytearray:
    """One object (the version ``info`` names) in a new buffer, read as :func:`read_into` reads."""
    buffer = bytearray(info.size)
    read_into(memoryview(buffer), url, info, client)
    return buffer


def read_into(target: memoryview, url: str, info: ObjectInfo, client: Client) -> None:
    """One object (the version ``info`` names) read as concurrent ranges of ``part_size`` straight into
    ``target`` (its size), and checked against ``info``'s crc32c without another pass over the bytes;
    read again, all of it, while damaged, as retries allow."""
    context = client.context()

    def read() -> int:
        return run(read_ranges_into(context, url, info.generation, 0, target, client.transfer.part_size))

    def check(crc: int) -> None:
        check_crc32c(url, crc32c_base64(crc), {"GCS": info.crc32c})

    reread_while_damaged(read, check, client.retry, url, client.stats.count_retry)
