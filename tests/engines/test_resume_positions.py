"""A lister's saved position (the DataPipe's state_dict; torchdata.nodes' ListFiles shares the check, see
tests/nodes) is refused with a ResumeError when malformed, or when it names an object its input does not list."""

from __future__ import annotations

from typing import Any

import pytest

from torchdata_gcs import ClientConfig, GCSFileListerIterDataPipe, ResumeError
from torchdata_gcs.testing import Emulator

BUCKET = "resume-positions"


@pytest.fixture(scope="module")
def inputs(gcs_emulator: Emulator) -> list[str]:
    gcs_emulator.seed(BUCKET, {f"{folder}/{i}.bin": b"x" for folder in ("a", "c", "d") for i in range(4)})
    return [f"gs://{BUCKET}/a/", f"gs://{BUCKET}/c/"]


@pytest.mark.parametrize(
    ("state", "words"),
    [
        ({"after": [-1, f"gs://{BUCKET}/a/0.bin"]}, "'after' must be None or [input index >= 0, gs:// URL]"),
        ({"after": ["0", f"gs://{BUCKET}/a/0.bin"]}, "got ['0', "),
        ({"after": [0, 5]}, "got [0, 5]"),
        ({"after": [True, f"gs://{BUCKET}/a/0.bin"]}, "got [True, "),
        ({"after": "gs://x/y"}, "got 'gs://x/y'"),
        ({"after": [0, "/data/a/0.bin"]}, "'after' names no object"),
        ({}, "expected {'after': ...} from a lister, got {}"),
        ([0, "gs://x/y"], "expected {'after': ...}"),
    ],
)
def test_a_malformed_position_is_refused_and_changes_nothing(
    inputs: list[str], client: ClientConfig, state: Any, words: str
) -> None:
    pipe = GCSFileListerIterDataPipe(inputs, client=client)
    pipe.load_state_dict({"after": [0, f"gs://{BUCKET}/a/1.bin"]})
    with pytest.raises(ResumeError) as raised:
        pipe.load_state_dict(state)
    assert words in str(raised.value)
    assert list(pipe) == [f"gs://{BUCKET}/a/{i}.bin" for i in (2, 3)] + [f"gs://{BUCKET}/c/{i}.bin" for i in range(4)]


def test_a_position_taken_over_other_inputs_is_refused(inputs: list[str], client: ClientConfig) -> None:
    pipe = GCSFileListerIterDataPipe(inputs, client=client)
    iterator = iter(pipe)
    [next(iterator) for _ in range(6)]  # into the second input
    state = pipe.state_dict()
    assert state == {"after": [1, f"gs://{BUCKET}/c/1.bin"]}

    for other, here in [
        ([f"gs://{BUCKET}/c/"], "here there are 1 inputs"),
        ([f"gs://{BUCKET}/a/", f"gs://{BUCKET}/d/"], f"here input 1 is gs://{BUCKET}/d/"),
        ([f"gs://{BUCKET}/a/", "gs://another-bucket/c/"], "here input 1 is gs://another-bucket/c/"),
    ]:
        resumed = GCSFileListerIterDataPipe(other, client=client)
        resumed.load_state_dict(state)
        with pytest.raises(ResumeError, match="resuming would skip or repeat objects") as raised:
            list(resumed)
        assert f"resumes after gs://{BUCKET}/c/1.bin, listed from input 1" in str(raised.value)
        assert here in str(raised.value)

    same = GCSFileListerIterDataPipe(inputs, client=client)
    same.load_state_dict(state)
    assert list(same) == [f"gs://{BUCKET}/c/{i}.bin" for i in (2, 3)]
