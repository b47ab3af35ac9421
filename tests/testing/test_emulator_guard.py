"""An emulator that keeps objects in a folder writes nothing outside it, whatever names it is sent."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote, urlencode, urlsplit

import pytest

from torchdata_gcs.testing import Emulator

BUCKET = "guarded"


def escapes(root: Path) -> list[str]:
    """Names that a filesystem path reads as leaving the folder: up from the bucket's folder, to this
    test's folder and beyond, and absolute ones."""
    deep = "../" * (len(root.parts) + 2)
    return ["../../escaped", f"{deep}{root.relative_to('/')}/escaped", f"{root}/escaped", "a/../../../escaped", ".."]


def send(
    endpoint: str, method: str, target: str, body: bytes = b"", headers: Mapping[str, str] | None = None
) -> tuple[int, bytes, http.client.HTTPMessage]:
    """One raw request, its path sent as given (no client tidies ``..`` away): status, body, headers."""
    host, port = endpoint.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request(method, target, body=body or None, headers=dict(headers or {}))
        answer = connection.getresponse()
        return answer.status, answer.read(), answer.headers
    finally:
        connection.close()


def resumable(endpoint: str, target: str, metadata: dict[str, object]) -> tuple[int, bytes, http.client.HTTPMessage]:
    """A resumable upload: started (``metadata`` as its JSON body), then its bytes sent in one PUT."""
    body = json.dumps(metadata).encode() if metadata else b""
    started = send(endpoint, "POST", target, body, {"Content-Type": "application/json"} if body else {})
    if started[0] != 200:
        return started
    location = urlsplit(started[2]["Location"])
    return send(endpoint, "PUT", f"{location.path}?{location.query}", b"resumable")


def multipart(metadata: dict[str, object], data: bytes) -> tuple[bytes, dict[str, str]]:
    body = b"".join(
        [
            b"--part\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n" + json.dumps(metadata).encode(),
            b"\r\n--part\r\nContent-Type: application/octet-stream\r\n\r\n" + data,
            b"\r\n--part--\r\n",
        ]
    )
    return body, {"Content-Type": "multipart/related; boundary=part"}


def first(metadata: dict[str, object]) -> bytes:
    return json.dumps(metadata).encode()


def writes(endpoint: str, name: str) -> dict[str, int]:
    """Every way a client may name an object to write, each sent once: their statuses."""
    path = quote(name, safe="")
    upload = f"/upload/storage/v1/b/{BUCKET}/o"
    named = f"{upload}?{urlencode({'uploadType': 'multipart', 'name': name})}"
    related = f"{upload}?uploadType=multipart"
    ordinary = {"name": "ordinary/decoy.bin"}
    named_ = {"name": name}
    sent = {
        "media": send(endpoint, "POST", f"{upload}?{urlencode({'uploadType': 'media', 'name': name})}", b"media"),
        "multipart": send(endpoint, "POST", f"{upload}?uploadType=multipart", *multipart({"name": name}, b"mp")),
        "multipart-named-in-query": send(endpoint, "POST", named, *multipart({}, b"query")),
        # What Go's multipart reader and JSON decoder take where a looser parser reads otherwise:
        "multipart-key-in-another-case": send(endpoint, "POST", related, *multipart({"Name": name}, b"case")),
        "multipart-after-a-false-delimiter": send(
            endpoint,
            "POST",
            related,
            b"--partX\r\n\r\n" + first(ordinary) + b"\r\n" + multipart({"name": name}, b"false")[0],
            {"Content-Type": "multipart/related; boundary=part"},
        ),
        "multipart-named-first-in-query": send(
            endpoint, "POST", f"{related}&uploadType=media", *multipart(named_, b"q")
        ),
        "multipart-without-part-headers": send(
            endpoint,
            "POST",
            related,
            b"--part\r\n\r\n"
            + first({"name": name})
            + b"\r\n\r\n"
            + first(ordinary)
            + b"\r\n--part\r\n\r\nx\r\n--part--\r\n",
            {"Content-Type": "multipart/related; boundary=part"},
        ),
        "resumable": resumable(endpoint, f"{upload}?{urlencode({'uploadType': 'resumable', 'name': name})}", {}),
        "resumable-named-in-body": resumable(endpoint, f"{upload}?uploadType=resumable", {"name": name}),
        "xml-put": send(endpoint, "PUT", f"/{BUCKET}/{name}", b"xml"),
        "xml-put-encoded": send(endpoint, "PUT", f"/{BUCKET}/{path}", b"xml"),
        "compose": send(
            endpoint,
            "POST",
            f"/storage/v1/b/{BUCKET}/o/{path}/compose",
            json.dumps({"sourceObjects": [{"name": "inside"}]}).encode(),
            {"Content-Type": "application/json"},
        ),
        "compose-source": send(
            endpoint,
            "POST",
            f"/storage/v1/b/{BUCKET}/o/composed/compose",
            json.dumps({"sourceObjects": [{"name": "inside"}, {"name": name}]}).encode(),
            {"Content-Type": "text/plain"},  # the emulator reads the JSON whatever the type says
        ),
        "rewrite": send(endpoint, "POST", f"/storage/v1/b/{BUCKET}/o/inside/rewriteTo/b/{BUCKET}/o/{path}"),
        "copy": send(endpoint, "POST", f"/storage/v1/b/{BUCKET}/o/inside/copyTo/b/{BUCKET}/o/{path}"),
    }
    return {way: answer[0] for way, answer in sent.items()}


def removals(endpoint: str, name: str) -> dict[str, int]:
    """Every way a client may name an object to read or delete, each sent once: their statuses."""
    path = quote(name, safe="")
    batch = (
        f"--b\r\nContent-Type: application/http\r\nContent-ID: 1\r\n\r\n"
        f"DELETE /storage/v1/b/{BUCKET}/o/{path} HTTP/1.1\r\n\r\n\r\n--b--\r\n"
    )
    sent = {
        "read": send(endpoint, "GET", f"/download/storage/v1/b/{BUCKET}/o/{path}?alt=media"),
        "delete": send(endpoint, "DELETE", f"/storage/v1/b/{BUCKET}/o/{path}"),
        "batch-delete": send(
            endpoint, "POST", "/batch/storage/v1", batch.encode(), {"Content-Type": "multipart/mixed; boundary=b"}
        ),
    }
    return {way: answer[0] for way, answer in sent.items()}


def files_outside(root: Path, folder: Path) -> list[str]:
    return sorted(
        str(path) for path in root.rglob("*") if path.is_file() and folder not in path.parents and path != folder
    )


def test_names_that_would_leave_the_data_folder_never_reach_the_server(tmp_path: Path) -> None:
    """fake-gcs-server joins names into paths unchecked: through the emulator's endpoint, every request
    naming a '..' part or an absolute path is answered 400 (as GCS answers an invalid name) and nothing
    is written, read or deleted outside the folder; ordinary names (dots within a part, URL characters,
    unicode) still work, and every way of naming them is answered as without the guard."""
    folder = tmp_path / "jail" / "data"
    started = time.monotonic()
    with Emulator(data_dir=folder) as emulator:
        emulator.seed(BUCKET, {"inside": b"inside"})
        (tmp_path / "jail" / "victim").write_bytes(b"mine")
        for name in escapes(tmp_path):
            statuses = writes(emulator.endpoint, name)
            assert files_outside(tmp_path, folder) == [str(tmp_path / "jail" / "victim")], name
            statuses |= removals(emulator.endpoint, name)
            assert statuses == dict.fromkeys(statuses, 400), name
        assert (tmp_path / "jail" / "victim").read_bytes() == b"mine"

        # Dots that are not a whole part, URL characters, spaces and unicode are ordinary names.
        ordinary = ["a b#c?d%25e+f/ü.bin", "dots/..x/x../.../a..b", ".hidden/.x", "end.", "~/$HOME"]
        emulator.seed(BUCKET, {name: name.encode() for name in ordinary})
        assert set(ordinary) <= set(emulator.names(BUCKET))
        assert all(emulator.read(BUCKET, name) == name.encode() for name in ordinary)
        # With ordinary names every request is answered as by an emulator without a folder (or a guard).
        statuses = writes(emulator.endpoint, "ordinary/name.bin") | removals(emulator.endpoint, "ordinary/name.bin")
    with Emulator() as unguarded:
        unguarded.seed(BUCKET, {"inside": b"inside"})
        assert statuses == writes(unguarded.endpoint, "ordinary/name.bin") | removals(
            unguarded.endpoint, "ordinary/name.bin"
        )
    assert [way for way, status in statuses.items() if status != 200] == ["xml-put", "xml-put-encoded"]  # no XML API
    assert time.monotonic() - started < 60
    assert not os.path.exists(tmp_path / "escaped") and not os.path.exists(tmp_path / "jail" / "escaped")


def servers_of(folder: Path) -> list[int]:
    """The fake-gcs-server processes keeping their objects in ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, NotADirectoryError, PermissionError, ProcessLookupError):
            continue
        ours = b"-filesystem-root" in command and str(folder).encode() in command
        if ours and "fake-gcs-server" in os.path.basename(command[0].decode()):
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, waiting for its parent to collect its status, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between open and read
        return False


def listening_ports(pid: int) -> list[int]:
    """The TCP ports process ``pid`` listens on, as its own network sees them."""
    sockets = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    with open(f"/proc/{pid}/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return [int(row[1].split(":")[1], 16) for row in rows if row[3] == "0A" and f"socket:[{row[9]}]" in sockets]


def namespaces_allowed() -> bool:
    """Whether this system gives an unprivileged process a user and network namespace whose loopback it
    may bring up (asked of util-linux and iproute2, not of the code under test)."""
    if not (shutil.which("unshare") and shutil.which("ip")):
        return False
    probe = ["unshare", "--user", "--map-root-user", "--net", "ip", "link", "set", "lo", "up"]
    return subprocess.run(probe, check=False, capture_output=True, timeout=60).returncode == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads processes and sockets from /proc")
def test_no_local_process_reaches_the_server_but_through_the_guard(tmp_path: Path) -> None:
    """Where Linux allows, the server listens where no other process of this machine can connect (a
    network of the guard's own); it never outlives the guard, even one killed with SIGKILL."""
    folder = tmp_path / "data"
    with Emulator(data_dir=folder) as emulator:
        emulator.seed(BUCKET, {"a": b"through the guard"})
        (server,) = servers_of(folder)
        ports = listening_ports(server)
        assert len(ports) == 1
        if namespaces_allowed():
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", ports[0]), timeout=5).close()
        else:  # the documented fallback: a loopback port of its own, which only the guard is told of
            assert f"127.0.0.1:{ports[0]}" != emulator.endpoint.removeprefix("http://")
        assert emulator.read(BUCKET, "a") == b"through the guard"
        os.kill(emulator._server.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while alive(server):
            assert time.monotonic() < deadline, "the server outlived its guard"
            time.sleep(0.05)


def test_a_resumable_chunk_sent_with_post_streams_through(tmp_path: Path) -> None:
    """GCS takes a resumable upload's chunks as PUT or POST to the session (gcsfs POSTs them): a POSTed
    chunk is an object's bytes, passed through unread, not a body to check for names."""
    with Emulator(data_dir=tmp_path / "data") as emulator:
        emulator.seed(BUCKET, {})
        target = f"/upload/storage/v1/b/{BUCKET}/o?{urlencode({'uploadType': 'resumable', 'name': 'posted'})}"
        status, _, headers = send(emulator.endpoint, "POST", target)
        assert status == 200
        location = urlsplit(headers["Location"])
        data = bytes(range(256)) * 64  # not JSON
        chunk = {"Content-Range": f"bytes 0-{len(data) - 1}/{len(data)}"}
        status, body, _ = send(emulator.endpoint, "POST", f"{location.path}?{location.query}", data, chunk)
        assert status == 200, body
        assert emulator.read(BUCKET, "posted") == data
