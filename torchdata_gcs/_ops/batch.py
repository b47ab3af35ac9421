"""Many deletes in few requests: GCS's JSON batch endpoint (``POST /batch/storage/v1``, ``multipart/mixed``,
at most 100 calls each), each call's own answer read from the ``multipart/mixed`` reply. ``rm -r`` and
``clean`` delete thousands of objects this way with one request per hundred instead of one per object."""

from __future__ import annotations

import asyncio
import email.message
import json
import logging
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .._transport.context import RequestContext, with_retry
from .._transport.http import error_detail, error_for_status, is_missing_bucket, retry_after_seconds
from .._transport.retry import Attempts, is_retryable
from .._transport.session import query_string
from ..errors import GCSError, TransientError
from .objects import delete_object, is_delete_answer
from .urls import format_url

__all__ = [
    "MAX_BATCH_CALLS",
    "BatchAnswer",
    "batch_body",
    "delete_objects",
    "http_message",
    "mixed_parts",
    "parse_batch_answer",
]

logger = logging.getLogger(__name__)

MAX_BATCH_CALLS = 100
"""GCS's limit of calls in one batch request ("You should not include more than 100 calls")."""

_NO_BATCH_ENDPOINT = frozenset({404, 405, 501})
"""How an endpoint without a batch endpoint answers one (GCS has it): its deletes are then sent one by one."""

_BLANK_LINE = re.compile(rb"\r?\n\r?\n")
_STATUS_LINE = re.compile(r"HTTP/\d(?:\.\d)? (\d{3})")


@dataclass(frozen=True)
class BatchAnswer:
    """One inner answer of a batch: its part's ``Content-ID`` (``None`` if it has none), the inner HTTP
    status, headers (names in lower case) and body."""

    content_id: str | None
    status: int
    headers: dict[str, str]
    body: bytes


def batch_body(calls: Sequence[str], token: str) -> tuple[bytes, str]:
    """The body and ``Content-Type`` of a batch of ``calls`` (each ``"METHOD /path?query"``, the path part
    only, as GCS asks), part ``i`` (from 1) with ``Content-ID: <token+i>``."""
    boundary = uuid.uuid4().hex
    parts = [
        f"--{boundary}\r\nContent-Type: application/http\r\nContent-ID: <{token}+{i}>\r\n\r\n{call} HTTP/1.1\r\n\r\n"
        for i, call in enumerate(calls, 1)
    ]
    return ("".join(parts) + f"--{boundary}--\r\n").encode(), f"multipart/mixed; boundary={boundary}"


def mixed_parts(content_type: str, body: bytes) -> list[tuple[dict[str, str], bytes]]:
    """The parts of a ``multipart/mixed`` document, each as its headers (names in lower case) and content,
    from its ``Content-Type`` (which names the boundary, quoted or not; lines end in CRLF or bare LF);
    ``ValueError`` for another type, no boundary, or no closing boundary (a document cut short)."""
    header = email.message.Message()
    header["Content-Type"] = content_type
    boundary = header.get_param("boundary") if header.get_content_type() == "multipart/mixed" else None
    if not isinstance(boundary, str) or not boundary:
        raise ValueError(f"not multipart/mixed with a boundary: {content_type!r}")
    pieces = body.split(b"--" + boundary.encode("latin-1"))
    if len(pieces) < 2 or not pieces[-1].startswith(b"--"):
        raise ValueError(f"the document ({len(body)} bytes) does not end with its closing boundary")
    parts = []
    for piece in pieces[1:-1]:
        piece = piece.partition(b"\n")[2]  # the rest of the boundary line, then the part
        piece = piece[:-2] if piece.endswith(b"\r\n") else piece[:-1] if piece.endswith(b"\n") else piece
        head, content = http_message(b"\n" + piece)[1:]
        parts.append(({name.lower(): value for name, value in head}, content))
    return parts


def http_message(data: bytes) -> tuple[str, list[tuple[str, str]], bytes]:
    """An HTTP message's start line (a request's or an answer's), header lines and body.

    >>> http_message(b"HTTP/1.1 204 No Content\\r\\nX-A: 1\\r\\n\\r\\n")
    ('HTTP/1.1 204 No Content', [('X-A', '1')], b'')
    """
    blank = _BLANK_LINE.search(data)
    head, body = (data, b"") if blank is None else (data[: blank.start()], data[blank.end() :])
    start, _, lines = head.partition(b"\n")
    named = (line.partition(b":") for line in lines.splitlines() if b":" in line)
    headers = [(name.strip().decode("latin-1"), value.strip().decode("latin-1")) for name, _, value in named]
    return start.strip().decode("latin-1"), headers, body


def parse_batch_answer(content_type: str, body: bytes) -> list[BatchAnswer]:
    """The inner answers of a batch reply, in order, from its ``Content-Type`` and body (see
    :func:`mixed_parts`); ``ValueError`` for a reply that is not a whole ``multipart/mixed`` document of
    HTTP answers.

    >>> reply = b'--b\\r\\nContent-Type: application/http\\r\\nContent-ID: <response-t+1>\\r\\n\\r\\n'
    >>> reply += b'HTTP/1.1 204 No Content\\r\\n\\r\\n\\r\\n--b--\\r\\n'
    >>> [(a.content_id, a.status) for a in parse_batch_answer("multipart/mixed; boundary=b", reply)]
    [('<response-t+1>', 204)]
    """
    answers = []
    for part_headers, content in mixed_parts(content_type, body):
        status_line, headers, inner_body = http_message(content)
        status = _STATUS_LINE.match(status_line)
        if status is None:
            raise ValueError(f"an inner answer has no status line: {status_line[:80]!r}")
        inner_headers = {name.lower(): value for name, value in headers}
        answers.append(BatchAnswer(part_headers.get("content-id"), int(status.group(1)), inner_headers, inner_body))
    return answers


async def delete_objects(
    context: RequestContext, bucket: str, versions: Sequence[tuple[str, int]], *, live: bool
) -> list[bool | GCSError]:
    """Delete each ``(name, generation)`` of ``bucket`` in batch requests of at most 100 deletes, sent
    concurrently; for each, in order: ``True`` deleted, ``False`` already gone, or the error that
    kept it (``PreconditionFailedError``: not that generation any more, so kept; ``NotFoundError``
    of a missing bucket; others typed as a single delete's would be).

    ``live=True`` deletes the live object only while it is ``generation`` (``ifGenerationMatch``), as
    fsspec ``rm`` does; ``live=False`` deletes that version for good, live or noncurrent, as ``clean``
    does. Either way GCS applies each delete at most once, so the calls answered 408, 429 or 5xx are
    sent again, alone, in later batches (backoff and deadline of ``context.retry``), and a resent call
    answered 404 or 412 finds the object deleted by an earlier attempt whose answer was lost. An endpoint
    that has no batch endpoint, or does not carry batched calls out, gets the deletes one by one.
    """
    outcomes: list[bool | GCSError | None] = [None] * len(versions)
    sent = [0] * len(versions)
    attempts = Attempts(context.retry, format_url(bucket), context.stats.count_retry)
    pending = list(range(len(versions)))
    while pending:
        groups = [pending[start : start + MAX_BATCH_CALLS] for start in range(0, len(pending), MAX_BATCH_CALLS)]
        rounds = await asyncio.gather(
            *(_send(context, bucket, versions, group, sent, live=live) for group in groups), return_exceptions=True
        )
        pending, alone, failure = [], [], None
        for group, answers in zip(groups, rounds, strict=True):
            if isinstance(answers, GCSError) and answers.status in _NO_BATCH_ENDPOINT:
                alone += group
                continue
            if isinstance(answers, GCSError):  # the batch request failed for good, retries spent: so did its calls
                for index in group:
                    outcomes[index] = answers
                continue
            if isinstance(answers, BaseException):
                raise answers
            for index, outcome in zip(group, answers, strict=True):
                if outcome is None:
                    alone.append(index)
                elif isinstance(outcome, GCSError) and is_retryable(outcome):
                    pending.append(index)
                    failure = failure or outcome
                    if outcome.status == 429:  # as with_retry counts a throttled request
                        context.stats.throttled += 1
                        context.session.throttle.throttled()
                outcomes[index] = outcome
        if alone:
            logger.info(
                "%s did not carry out %d batched deletes: sending them one by one", context.session.endpoint, len(alone)
            )
            singles = await asyncio.gather(
                *(_delete_alone(context, bucket, *versions[index], live=live) for index in alone)
            )
            for index, outcome in zip(alone, singles, strict=True):
                outcomes[index] = outcome
        if failure is not None:
            try:
                await asyncio.sleep(attempts.delay_after(failure))
            except GCSError:
                break  # retries ran out: those calls keep their last error
    return [outcome if outcome is not None else False for outcome in outcomes]


async def _send(
    context: RequestContext,
    bucket: str,
    versions: Sequence[tuple[str, int]],
    group: list[int],
    sent: list[int],
    *,
    live: bool,
) -> list[bool | GCSError | None]:
    """One batch request for the deletes ``group`` (indexes into ``versions``), retried as a whole while
    it fails as a whole; the outcome of each call."""
    session = context.session
    calls = []
    for index in group:
        name, generation = versions[index]
        params: dict[str, Any] = {"ifGenerationMatch" if live else "generation": generation}
        params, _ = session.billed(params, None, xml_api=False)
        calls.append(f"DELETE {urlsplit(session.object_path(bucket, name)).path}?{query_string(params)}")
    token = uuid.uuid4().hex
    body, content_type = batch_body(calls, token)
    batch_path = batch_url = f"{session.endpoint}/batch/storage/v1"  # errors name the endpoint, not a bucket

    async def attempt() -> list[BatchAnswer]:
        for index in group:
            sent[index] += 1
        async with session.send("POST", batch_url, batch_path, {}, {"Content-Type": content_type}, data=body) as answer:
            reply = await answer.read()
            try:
                answers = parse_batch_answer(answer.headers.get("Content-Type", ""), reply)
            except ValueError as exc:
                raise TransientError(f"{batch_url}: a batch answer that cannot be read: {exc}", url=batch_url) from None
        if len(answers) != len(group):
            raise TransientError(
                f"{batch_url}: a batch of {len(group)} calls answered {len(answers)} times", url=batch_url
            )
        return _in_request_order(answers, token)

    answers = await with_retry(context, batch_url, attempt)
    return [
        _outcome(bucket, versions[index][0], answer, sent[index] > 1)
        for index, answer in zip(group, answers, strict=True)
    ]


def _in_request_order(answers: list[BatchAnswer], token: str) -> list[BatchAnswer]:
    """The answers ordered as the calls, by their ``Content-ID`` (``<response-token+i>``) where each has
    one; GCS documents the same order, which stands for answers without one."""
    ids = [f"<response-{token}+{i}>" for i in range(1, len(answers) + 1)]
    by_id = {answer.content_id: answer for answer in answers}
    if all(content_id in by_id for content_id in ids):
        return [by_id[content_id] for content_id in ids]
    return answers


async def _delete_alone(
    context: RequestContext, bucket: str, name: str, generation: int, *, live: bool
) -> bool | GCSError:
    """The delete of one version by a request of its own, as :func:`delete_objects` reports it."""
    pinned = {"if_generation_match": generation} if live else {"generation": generation}
    try:
        return await delete_object(context, bucket, name, **pinned)
    except GCSError as exc:
        return exc


def _carried_out(answer: BatchAnswer) -> bool:
    """Whether the endpoint carried the call out: GCS answers every error of the JSON API with its JSON error
    document, and a 400 without one is an endpoint that does not serve batched calls as GCS does
    (fake-gcs-server answers "unable to process request" to any call with a query string)."""
    if answer.status != 400:
        return True
    try:
        return isinstance(json.loads(answer.body)["error"], dict)
    except (ValueError, KeyError, TypeError):
        return False


def _outcome(bucket: str, name: str, answer: BatchAnswer, resent: bool) -> bool | GCSError | None:
    """What one inner answer means for the delete of ``name`` (``None``: not carried out, to send alone); a
    ``resent`` call answered 404 or 412 found the work of an earlier attempt whose answer was lost."""
    if 200 <= answer.status < 300:  # an answer that is not GCS's says nothing: sent alone, where it is judged
        return True if is_delete_answer(answer.headers.get("content-type"), answer.body) else None
    if not _carried_out(answer):
        return None
    url = format_url(bucket, name)
    detail = error_detail(answer.body.decode("utf-8", errors="replace"))
    error = error_for_status(
        answer.status, url, detail, retry_after=retry_after_seconds(answer.headers.get("retry-after"))
    )
    if answer.status == 404 and not is_missing_bucket(error):
        return resent
    if answer.status == 412 and resent:
        return True
    return error
