"""The streaming multipart writer over real HTTP: through GCSFront's XML multipart upload on the emulator."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace

import pytest

from torchdata_gcs import ClientConfig, PreconditionFailedError, RetryConfig, UploadError, WriteConfig, checkpoint
from torchdata_gcs._engines.upload import MIN_PART_SIZE, MultipartWriter, new_writer
from torchdata_gcs._ops.client import Client
from torchdata_gcs._transport.loop import io_loop
from torchdata_gcs.testing import Emulator, Fault, GCSFront

MiB = 1024 * 1024
BUCKET = "upload-writer"
FAST_RETRY = RetryConfig(max_attempts=3, initial_delay=0.01, max_delay=0.05)


@pytest.fixture
def front(gcs_emulator: Emulator, gcs_front: GCSFront) -> GCSFront:
    gcs_emulator.create_bucket(BUCKET)
    return gcs_front


def writer(front: GCSFront, name: str, **settings) -> MultipartWriter:
    settings.setdefault("part_size", MIN_PART_SIZE)
    client = Client(front.client_config, settings.pop("retry", None))
    return MultipartWriter(f"gs://{BUCKET}/{name}", client=client, **settings)


def test_streams_parts_and_publishes_on_close(front: GCSFront, gcs_emulator: Emulator) -> None:
    data = os.urandom(12 * MiB + 12345)
    with writer(front, "ckpt/a.bin") as out:
        for start in range(0, len(data), 777_777):  # writes of any size
            out.write(memoryview(data)[start : start + 777_777])
        assert front.open_uploads == [(BUCKET, "ckpt/a.bin")]  # parts are out before close
        assert "ckpt/a.bin" not in gcs_emulator.names(BUCKET)
    assert gcs_emulator.read(BUCKET, "ckpt/a.bin") == data
    assert front.counts["upload"] == 1 + 1 + 3 + 1  # initiate, its marker, 5 + 5 + 2.01 MiB parts, complete
    assert front.open_uploads == [] and out.generation


def test_small_payload_is_one_request(front: GCSFront, gcs_emulator: Emulator) -> None:
    with writer(front, "small.bin") as out:
        out.write(b"tiny")
    assert gcs_emulator.read(BUCKET, "small.bin") == b"tiny"
    assert front.counts["upload"] == 1 and front.open_uploads == []


def test_exception_inside_with_publishes_nothing(front: GCSFront, gcs_emulator: Emulator) -> None:
    with pytest.raises(RuntimeError, match="model diverged"), writer(front, "failed.bin") as out:
        out.write(os.urandom(11 * MiB))
        raise RuntimeError("model diverged")
    assert "failed.bin" not in gcs_emulator.names(BUCKET)
    assert front.open_uploads == [] and front.counts["delete"] == 2  # the abort, the upload's marker


def test_dropped_writer_publishes_nothing(front: GCSFront, gcs_emulator: Emulator) -> None:
    out = writer(front, "dropped.bin")
    out.write(os.urandom(6 * MiB))
    assert front.open_uploads == [(BUCKET, "dropped.bin")]
    del out
    gc.collect()
    assert "dropped.bin" not in gcs_emulator.names(BUCKET)
    assert front.open_uploads == []


def test_part_failures_are_retried(gcs_emulator: Emulator) -> None:
    gcs_emulator.create_bucket(BUCKET)
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_503", match=r"PUT .*partNumber", times=2)]) as front:
        data = os.urandom(11 * MiB)
        with writer(front, "flaky.bin", retry=FAST_RETRY) as out:
            out.write(data)
        assert front.faults_injected["http_503"] == 2
    assert gcs_emulator.read(BUCKET, "flaky.bin") == data


def test_a_part_that_keeps_failing_aborts(gcs_emulator: Emulator) -> None:
    gcs_emulator.create_bucket(BUCKET)
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_503", match=r"PUT .*partNumber=2")]) as front:
        retry = replace(FAST_RETRY, deadline=1)  # a 503 is retried until the deadline
        with pytest.raises(UploadError, match="aborted"), writer(front, "doomed.bin", retry=retry) as out:
            out.write(os.urandom(16 * MiB))
        assert front.open_uploads == []
    assert "doomed.bin" not in gcs_emulator.names(BUCKET)


def test_part_sizes_grow_to_stay_within_the_part_limit(front: GCSFront, gcs_emulator: Emulator) -> None:
    data = os.urandom(31 * MiB)
    with writer(front, "growing.bin", parts_per_size=2, max_parts_in_flight=2) as out:
        out.write(data)
    # 5, 5, 10, 10 MiB and the last 1 MiB: 5 parts, where a fixed 5 MiB would take 7.
    assert front.counts["upload"] == 1 + 1 + 5 + 1  # initiate, marker, parts, complete
    assert gcs_emulator.read(BUCKET, "growing.bin") == data


def test_bad_settings() -> None:
    with pytest.raises(ValueError, match="part_size"):
        MultipartWriter("gs://bucket/x", client=Client(ClientConfig()), part_size=MiB)
    with pytest.raises(ValueError, match="max_parts_in_flight"):
        MultipartWriter("gs://bucket/x", client=Client(ClientConfig()), max_parts_in_flight=0)
    with pytest.raises(ValueError, match="no preconditions"):  # GCS's XML multipart uploads take none
        MultipartWriter("gs://bucket/x", client=Client(ClientConfig()), only_if_new=True)


@pytest.mark.parametrize("strategy", ["multipart", "compose"])
def test_new_writer_carries_only_if_new_by_compose(front: GCSFront, gcs_emulator: Emulator, strategy: str) -> None:
    """Where a precondition is asked for, a multipart strategy writes by compose, whose destination
    takes ``ifGenerationMatch=0``; a retry meeting its own lost compose is recognised by the bytes."""
    gcs_emulator.upload(BUCKET, f"exists-{strategy}", b"kept")
    config = WriteConfig(part_size=MIN_PART_SIZE, strategy=strategy)  # type: ignore[arg-type]
    data = os.urandom(6 * MiB)
    with (
        pytest.raises(PreconditionFailedError),
        new_writer(
            f"gs://{BUCKET}/exists-{strategy}", Client(front.client_config, FAST_RETRY), config, only_if_new=True
        ) as out,
    ):
        out.write(data)
    assert gcs_emulator.read(BUCKET, f"exists-{strategy}") == b"kept"
    front.set_faults([Fault("truncate", match="compose", times=1)])  # the compose happens, its answer is cut
    client = Client(front.client_config, FAST_RETRY)
    with new_writer(f"gs://{BUCKET}/new-{strategy}", client, config, only_if_new=True) as out:
        out.write(data)
    assert gcs_emulator.read(BUCKET, f"new-{strategy}") == data and front.faults_injected["truncate"] == 1
    assert [n for n in gcs_emulator.names(BUCKET) if n.startswith(".torchdata-gcs-tmp/")] == []


def test_writer_dropped_on_the_io_thread_aborts_without_deadlock(front: GCSFront, gcs_emulator: Emulator) -> None:
    out = writer(front, "dropped-on-loop.bin")
    out.write(os.urandom(6 * MiB))
    holder = [out]
    del out

    async def drop() -> None:
        holder.clear()  # the last reference goes on the I/O thread: the finalizer runs there

    asyncio.run_coroutine_threadsafe(drop(), io_loop()).result(timeout=10)
    deadline = time.monotonic() + 10
    while front.open_uploads:
        assert time.monotonic() < deadline, "the dropped writer's upload was never aborted"
        time.sleep(0.05)
    assert "dropped-on-loop.bin" not in gcs_emulator.names(BUCKET)


def test_a_lost_completion_answer_is_recognised_by_the_published_bytes(gcs_emulator: Emulator) -> None:
    gcs_emulator.create_bucket(BUCKET)
    completion = Fault("truncate", match=r"POST .*uploadId=", times=1)  # done, but the answer is cut
    with GCSFront(gcs_emulator.endpoint, faults=[completion]) as front:
        data = os.urandom(6 * MiB)
        with writer(front, "lost-answer.bin", retry=FAST_RETRY) as out:
            out.write(data)
        assert front.faults_injected["truncate"] == 1 and front.open_uploads == []
    assert gcs_emulator.read(BUCKET, "lost-answer.bin") == data
    assert out.generation is not None


def completion_posts(front: GCSFront) -> int:
    return sum(r.method == "POST" and "uploadId=" in r.target for r in front.recorded)


def test_a_completion_slower_than_the_read_timeout_is_awaited_in_one_request(gcs_emulator: Emulator) -> None:
    """GCS may take minutes to complete an upload: the completion waits for its answer past ``read_timeout``."""
    gcs_emulator.create_bucket(BUCKET)
    with GCSFront(gcs_emulator.endpoint, completion_delay=1.5, record=True) as front:
        client = ClientConfig(endpoint=front.endpoint, anonymous=True, read_timeout=0.5)
        data = os.urandom(6 * MiB)
        with MultipartWriter(f"gs://{BUCKET}/slow.bin", client=Client(client), part_size=MIN_PART_SIZE) as out:
            out.write(data)
        assert completion_posts(front) == 1 and front.open_uploads == []
    assert gcs_emulator.read(BUCKET, "slow.bin") == data


def test_a_completion_slower_than_the_save_deadline_is_awaited_under_its_own(gcs_emulator: Emulator) -> None:
    """A save bounds all its requests by one deadline, but the completion, which GCS documents as taking
    minutes, waits up to ``completion_timeout`` whatever is left of it."""
    gcs_emulator.create_bucket(BUCKET)
    with GCSFront(gcs_emulator.endpoint, completion_delay=2.5, record=True) as front:
        client = ClientConfig(endpoint=front.endpoint, anonymous=True, completion_timeout=30)
        data = {"w": os.urandom(6 * MiB)}
        write = WriteConfig(strategy="multipart", part_size=MIN_PART_SIZE)
        url = f"gs://{BUCKET}/patient.pt"
        checkpoint.save(data, url, client=client, retry=replace(FAST_RETRY, deadline=1.5), write=write)
        assert completion_posts(front) == 1 and front.open_uploads == []
        assert checkpoint.load(url, client=client) == data


def test_a_lost_completion_answer_is_verified_before_the_completion_is_sent_again(gcs_emulator: Emulator) -> None:
    """The object is made at once, and the answer is lost: the object found holds the bytes written, so the
    completion is not sent again."""
    gcs_emulator.create_bucket(BUCKET)
    with GCSFront(gcs_emulator.endpoint, completion_delay=1.0, completion_answer="lost", record=True) as front:
        client = ClientConfig(endpoint=front.endpoint, anonymous=True, read_timeout=0.5)
        data = os.urandom(6 * MiB)
        with MultipartWriter(
            f"gs://{BUCKET}/lost.bin", client=Client(client, FAST_RETRY), part_size=MIN_PART_SIZE
        ) as out:
            out.write(data)
        assert completion_posts(front) == 1 and front.open_uploads == []
    assert gcs_emulator.read(BUCKET, "lost.bin") == data
    live = Client(gcs_emulator.client_config, FAST_RETRY).head(BUCKET, "lost.bin", "generation")
    assert live is not None and out.generation == int(live["generation"])


def test_no_such_upload_after_a_lost_answer_is_taken_as_done_once_the_object_is_verified(
    gcs_emulator: Emulator,
) -> None:
    """The first completion happens and its answer is cut; the object is not seen at the first look, so the
    completion goes again and is answered NoSuchUpload: an earlier attempt completed it, as the object shows."""
    gcs_emulator.create_bucket(BUCKET)
    faults = [
        Fault("truncate", match=r"POST .*uploadId=", times=1),
        Fault("http_404", match=r"GET /storage/v1/b/[^/]+/o/done\.bin", times=1),
    ]
    with GCSFront(gcs_emulator.endpoint, faults=faults, record=True) as front:
        data = os.urandom(6 * MiB)
        with writer(front, "done.bin", retry=FAST_RETRY) as out:
            out.write(data)
        assert completion_posts(front) == 2 and front.faults_injected == {"truncate": 1, "http_404": 1}
    assert gcs_emulator.read(BUCKET, "done.bin") == data


def test_no_such_upload_after_a_lost_answer_without_the_object_is_an_upload_error(gcs_emulator: Emulator) -> None:
    gcs_emulator.create_bucket(BUCKET)
    faults = [
        Fault("truncate", match=r"POST .*uploadId=", times=1),
        Fault("http_404", match=r"GET /storage/v1/b/[^/]+/o/unseen\.bin"),  # never seen
    ]
    with (
        GCSFront(gcs_emulator.endpoint, faults=faults) as front,
        pytest.raises(UploadError, match="outcome is unknown.*holds no object"),
        writer(front, "unseen.bin", retry=FAST_RETRY) as out,
    ):
        out.write(os.urandom(6 * MiB))


def test_a_completion_that_outlasts_completion_timeout_fails_in_time(gcs_emulator: Emulator) -> None:
    gcs_emulator.create_bucket(BUCKET)
    with GCSFront(gcs_emulator.endpoint, completion_delay=4.0) as front:
        client = ClientConfig(endpoint=front.endpoint, anonymous=True, read_timeout=0.5, completion_timeout=1.0)
        started = time.monotonic()
        with (
            pytest.raises(UploadError, match="outcome is unknown"),
            MultipartWriter(
                f"gs://{BUCKET}/late.bin", client=Client(client, FAST_RETRY), part_size=MIN_PART_SIZE
            ) as out,
        ):
            out.write(os.urandom(6 * MiB))
        assert time.monotonic() - started < 3.5  # the completion's deadline, not the front's delay


def test_a_lost_completion_over_the_same_bytes_leaves_no_upload_open(gcs_emulator: Emulator) -> None:
    """The URL holds the bytes written already and the completion never reached GCS: the save is done
    (the URL holds what was written) and its upload is aborted, not left billed."""
    gcs_emulator.create_bucket(BUCKET)
    data = os.urandom(6 * MiB)
    gcs_emulator.upload(BUCKET, "same.bin", data)
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("reset", match=r"POST .*uploadId=")], record=True) as front:
        with writer(front, "same.bin", retry=FAST_RETRY) as out:
            out.write(data)
        assert completion_posts(front) == 1 and front.open_uploads == []
    assert gcs_emulator.read(BUCKET, "same.bin") == data


SIGNALLED_SAVE = textwrap.dedent(
    """
    import signal, sys, time
    from torchdata_gcs import ClientConfig
    from torchdata_gcs._engines import upload
    from torchdata_gcs._ops.client import Client
    client = Client(ClientConfig(endpoint=sys.argv[1], anonymous=True))
    writer = getattr(upload, sys.argv[3])(f"gs://{sys.argv[2]}/ckpt.pt", client=client, part_size=upload.MIN_PART_SIZE)
    writer.write(b"x" * (upload.MIN_PART_SIZE + 1))  # the first part goes out
    print("default" if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else "handled", flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("strategy", ["MultipartWriter", "CompositeWriter"])
def test_sigterm_during_a_save_leaves_no_open_upload_and_no_part(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str, strategy: str
) -> None:
    """SIGTERM ends the saving process at once (the library sets no handler); its reaper aborts the
    multipart upload, which GCS would bill until aborted, and deletes its marker, or deletes the parts
    uploaded as temporary objects."""
    command = [sys.executable, "-c", SIGNALLED_SAVE, gcs_front.endpoint, gcs_bucket, strategy]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None
            if child.stdout.readline() != "default\n":  # a handler set, or the child failed: say how
                child.kill()
                pytest.fail(child.communicate()[1])
            started = time.monotonic()
            while not gcs_emulator.names(gcs_bucket):  # the marker, or the first part
                assert time.monotonic() - started < 30, "nothing was ever written: the test would prove nothing"
                time.sleep(0.05)
            child.send_signal(signal.SIGTERM)
            assert child.wait(timeout=10) == -signal.SIGTERM
        finally:
            child.kill()
    started = time.monotonic()
    while gcs_front.open_uploads or gcs_emulator.names(gcs_bucket):
        assert time.monotonic() - started < 30, (gcs_front.open_uploads, gcs_emulator.names(gcs_bucket))
        time.sleep(0.1)


LEFT_OPEN = textwrap.dedent(
    """
    import sys
    from torchdata_gcs import ClientConfig
    from torchdata_gcs._engines import upload
    from torchdata_gcs._ops.client import Client
    client = Client(ClientConfig(endpoint=sys.argv[1], anonymous=True))
    writer = getattr(upload, sys.argv[3])(f"gs://{sys.argv[2]}/ckpt.pt", client=client, part_size=upload.MIN_PART_SIZE)
    writer.write(b"x" * (3 * upload.MIN_PART_SIZE + 1))  # parts go out, and the script ends
    """
)


@pytest.mark.parametrize("strategy", ["MultipartWriter", "CompositeWriter"])
def test_a_writer_left_open_at_the_end_of_a_script_is_aborted_there(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str, strategy: str
) -> None:
    """A writer never closed when the script ends publishes nothing: it is aborted at exit while the I/O loop
    still runs (its parts discarded then, not left to the reaper), and the script ends at once, quietly."""
    command = [sys.executable, "-c", LEFT_OPEN, gcs_front.endpoint, gcs_bucket, strategy]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert time.monotonic() - started < 30
    assert not gcs_front.open_uploads and not gcs_emulator.names(gcs_bucket)
