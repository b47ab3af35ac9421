"""The aiohttp transport's answers through the seam: a body read into a caller's buffer, then as chunks,
then whole, each taking up where the last stopped."""

from __future__ import annotations

from torchdata_gcs._transport.loop import run
from torchdata_gcs._transport.session import session_for
from torchdata_gcs.testing import Emulator


def test_a_body_is_read_into_a_buffer_then_as_chunks_then_whole(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    data = bytes(range(256)) * 300
    gcs_emulator.seed(gcs_bucket, {"o.bin": data})
    session = session_for(gcs_emulator.client_config)
    url = f"gs://{gcs_bucket}/o.bin"

    async def read() -> tuple[int, bytes, bytes, bytes, int]:
        async with session.read_media(url, session.media_path(gcs_bucket, "o.bin"), {"alt": "media"}) as response:
            buffer = memoryview(bytearray(7))
            filled = 0
            while filled < len(buffer):
                filled += await response.readinto(buffer[filled:])
            first_chunk = b""
            async for chunk in response.chunks():
                first_chunk = chunk
                break
            rest = await response.read()
            return response.status, bytes(buffer), first_chunk, rest, await response.readinto(memoryview(bytearray(1)))

    status, head, chunk, rest, after_the_end = run(read())
    assert status == 200
    assert head == data[:7]
    assert chunk and head + chunk + rest == data
    assert after_the_end == 0
