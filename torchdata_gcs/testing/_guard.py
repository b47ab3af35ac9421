"""A guard for a filesystem-backed fake-gcs-server, which joins bucket and object names into file
paths unchecked: it starts the server where only it can reach it (a network namespace of its own, where
Linux allows) and answers any request naming a bucket or object that a path would read as leaving the
folder with GCS's 400 for an invalid name; every other request streams through. Run as
``python _guard.py PORT SERVER_COMMAND...`` (it imports only aiohttp).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from urllib.parse import parse_qsl, unquote, urlsplit

import aiohttp
from aiohttp import web
from yarl import URL

__all__ = ["main", "problem_in_request"]

_HOP_BY_HOP = frozenset(
    ["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "expect"]
)
_COPY_SOURCE = ("x-goog-copy-source", "x-amz-copy-source")
_CHUNK = 1 << 16
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_PR_SET_PDEATHSIG = 1


def _bad_name(name: str) -> str | None:
    """Why ``name`` (a bucket, an object or a prefix) would leave the emulator's folder, or ``None``: a
    ``.`` or ``..`` part (GCS refuses the names ``.`` and ``..``), or a leading ``/``."""
    if name.startswith("/"):
        return f"{name!r} starts with '/'"
    if any(part in (".", "..") for part in name.split("/")):
        return f"{name!r} has a '.' or '..' part"
    return None


def _bad_target(target: str) -> str | None:
    """Why a request target (path and query) names something outside the folder, or ``None``."""
    parts = urlsplit(target)
    segments = parts.path.split("/")[1:]
    if "" in segments[:-1]:
        return f"the path {parts.path!r} has an empty segment"
    for segment in segments:
        if problem := _bad_name(unquote(segment)):
            return problem
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key != "delimiter" and (problem := _bad_name(value)):  # a listing's "/" delimiter names nothing
            return problem
    return None


def _names(document: object) -> Iterator[str]:
    """Every ``name`` and ``bucket`` string in a JSON document, at any depth, in any case (Go's JSON
    decoder matches keys so: ``"Name"`` fills ``name``)."""
    if isinstance(document, dict):
        for key, value in document.items():
            if key.casefold() in ("name", "bucket") and isinstance(value, str):
                yield value
            else:
                yield from _names(value)
    elif isinstance(document, list):
        for value in document:
            yield from _names(value)


def _bad_json(body: bytes) -> str | None:
    """Why a JSON body (its first value, as Go's decoder reads it) names something outside, or ``None``."""
    try:
        document, _ = json.JSONDecoder().raw_decode(body.decode("utf-8").lstrip())
    except ValueError:
        return "its body is not JSON"
    return next(filter(None, map(_bad_name, _names(document))), None)


def _parts(content_type: str, body: bytes) -> list[bytes] | None:
    """The parts of a multipart body (headers included), as Go's reader finds them: between lines that
    are the delimiter and nothing but blanks, up to the closing one; ``None`` if there is no boundary."""
    match = re.search(r'boundary="?([^";]+)"?', content_type)
    if match is None:
        return None
    boundary = re.escape(match.group(1).encode("latin-1"))
    marks = list(re.finditer(rb"(?:\A|\n)--" + boundary + rb"(--)?[ \t]*(?:\r?\n|\Z)", body))
    parts = []
    for mark, following in zip(marks, [*marks[1:], None], strict=True):
        if mark.group(1):  # the closing delimiter
            break
        parts.append(body[mark.end() : len(body) if following is None else following.start()])
    return parts


def _content(message: bytes) -> bytes:
    """What follows a block of header lines and the empty line that ends it (``b""`` if none does)."""
    position = 0
    while (end := message.find(b"\n", position)) >= 0:
        if not message[position:end].rstrip(b"\r"):
            return message[end + 1 :]
        position = end + 1
    return b""


def _bad_body(content_type: str, body: bytes) -> str | None:
    """Why a body that may name objects does so outside the folder, or ``None``."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        return "form uploads are not served"
    if kind.startswith("multipart/"):
        parts = _parts(content_type, body)
        if not parts:
            return "its multipart body has no parts"
        if kind == "multipart/related":  # an upload: metadata, then the object's bytes
            return _bad_json(_content(parts[0]))
        for part in parts:  # a batch: each part one request, its first line the request line
            line, _, rest = _content(part).partition(b"\n")
            request_line = line.rstrip(b"\r").split(b" ")
            if len(request_line) != 3:
                return "a call of its batch has no request line"
            problem = _bad_target(request_line[1].decode("latin-1"))
            inner = _content(rest)
            if problem is None and inner.strip():
                problem = _bad_json(inner)
            if problem:
                return problem
        return None
    return _bad_json(body) if body.strip() else None


def _streamed(method: str, target: str) -> bool:
    """Whether the request's body is an object's bytes, streamed through unread: a media upload, a chunk
    of a resumable upload (``PUT``, or ``POST`` as GCS also takes it), an XML API upload. Any other body is
    read and checked."""
    query: dict[str, str] = {}
    for key, value in parse_qsl(urlsplit(target).query, keep_blank_values=True):
        query.setdefault(key, value)  # the first, as Go's Query().Get reads it
    if query.get("uploadType") == "media":
        return True
    if method in ("PUT", "POST") and query.get("uploadType") == "resumable" and query.get("upload_id"):
        return True
    return method == "PUT" and not target.startswith(("/storage/", "/upload/", "/batch/"))


def problem_in_request(target: str, headers: Mapping[str, str], body: bytes | None) -> str | None:
    """Why the request names a bucket or object outside the emulator's folder, or ``None``; ``body`` is
    ``None`` when it is streamed, unread.

    Names are looked for wherever the emulator reads them: each segment of the path (percent-decoded),
    every query value, the XML API's copy source, and the body of any request but a data upload (the
    JSON of a compose, rewrite or resumable upload, a multipart upload's metadata, a batch's calls). A
    body that should hold names and cannot be read is refused too.
    """
    problem = _bad_target(target)
    for header, value in headers.items():  # every one, if repeated
        if problem is None and header.lower() in _COPY_SOURCE:
            problem = _bad_target(value)
    if problem is None and body is not None:  # the first Content-Type, as Go's Header.Get reads it
        problem = _bad_body(headers.get("content-type", ""), body)
    return problem


def _refusal(problem: str) -> web.Response:
    message = f"Invalid object or bucket name: {problem}"
    error = {"code": 400, "message": message, "errors": [{"domain": "global", "reason": "invalid", "message": message}]}
    return web.json_response({"error": error}, status=400)


async def _forward(request: web.Request) -> web.StreamResponse:
    target = request.raw_path
    streamed = not request.body_exists or _streamed(request.method, target)
    body = None if streamed else await request.read()
    problem = problem_in_request(target, request.headers, body)
    if problem is not None:
        return _refusal(problem)
    session: aiohttp.ClientSession = request.app["session"]
    sent = body if body is not None else (request.content.iter_chunked(_CHUNK) if request.body_exists else None)
    outgoing = [(key, value) for key, value in request.headers.items() if key.lower() not in _HOP_BY_HOP]
    url = URL(request.app["upstream"] + target, encoded=True)
    try:
        answer = await session.request(
            request.method, url, headers=outgoing, data=sent, allow_redirects=False, skip_auto_headers=["Content-Type"]
        )
    except aiohttp.ClientConnectionError as exc:  # the server is starting, or gone
        return web.json_response({"error": {"code": 502, "message": f"the emulator did not answer: {exc}"}}, status=502)
    async with answer:
        response = web.StreamResponse(status=answer.status, reason=answer.reason)
        for key, value in answer.headers.items():
            if key.lower() not in _HOP_BY_HOP:
                response.headers.add(key, value)
        await response.prepare(request)
        async for chunk in answer.content.iter_chunked(_CHUNK):
            await response.write(chunk)
        await response.write_eof()
        return response


async def _open_session(app: web.Application) -> None:
    app["session"] = aiohttp.ClientSession(
        auto_decompress=False,
        skip_auto_headers=["User-Agent", "Accept-Encoding"],
        timeout=aiohttp.ClientTimeout(total=None, sock_read=600),
        connector=aiohttp.TCPConnector(limit=0),
    )


async def _close_session(app: web.Application) -> None:
    await app["session"].close()


def _enter_namespaces() -> str | None:
    """Move this (single-threaded) process into a user and a network namespace of its own, its loopback
    up and its user and group the same; why not, if Linux refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        return os.strerror(ctypes.get_errno())
    try:
        for name, line in (("uid_map", f"{uid} {uid} 1"), ("setgroups", "deny"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as mapping:
                mapping.write(line)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            flags = struct.unpack("16sH14x", fcntl.ioctl(probe, _SIOCGIFFLAGS, struct.pack("16sH14x", b"lo", 0)))[1]
            fcntl.ioctl(probe, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))
    except OSError as exc:
        return str(exc)
    return None


def _isolate() -> str | None:
    """Enter namespaces of our own (see :func:`_enter_namespaces`), tried first in a forked child: a
    network namespace whose loopback cannot be brought up (user namespaces without capabilities, as
    some distributions confine them) would leave nothing reachable. Why not, or ``None``."""
    if not sys.platform.startswith("linux"):
        return "namespaces are Linux's"
    child = os.fork()
    if child == 0:
        os._exit(0 if _enter_namespaces() is None else 1)
    if os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) != 0:
        return "this system refuses a user and network namespace to an unprivileged process"
    return _enter_namespaces()


def _start_server(command: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    """Start the server on a free loopback port of this process's network; it dies with this process."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    server = subprocess.Popen(
        [*command, "-port", str(port)],
        stdin=subprocess.DEVNULL,
        preexec_fn=lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGKILL),  # noqa: PLW1509 - no threads yet
    )
    return server, port


def main(argv: list[str]) -> None:
    """Serve on 127.0.0.1:``argv[0]`` in the network this process starts in, in front of the server that
    ``argv[1:]`` (without ``-port``) starts in namespaces of its own, until terminated."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(argv[0])))  # before isolating: this socket stays where clients are
    listener.listen(1024)
    why_not = _isolate()
    print(f"server isolated: {why_not or 'yes'}", file=sys.stderr, flush=True)
    server, port = _start_server(argv[1:])
    stopping = threading.Event()

    def stop_when_the_server_ends() -> None:
        server.wait()
        if not stopping.is_set():
            os.kill(os.getpid(), signal.SIGTERM)

    async def stop_the_server(app: web.Application) -> None:
        stopping.set()
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()

    threading.Thread(target=stop_when_the_server_ends, daemon=True).start()
    app = web.Application(client_max_size=1 << 40)  # whole bodies are read only where names may be
    app["upstream"] = f"http://127.0.0.1:{port}"
    app.on_startup.append(_open_session)
    app.on_cleanup.append(_close_session)
    app.on_cleanup.append(stop_the_server)
    app.router.add_route("*", "/{tail:.*}", _forward)
    web.run_app(app, sock=listener, print=None, access_log=None)


if __name__ == "__main__":
    main(sys.argv[1:])
