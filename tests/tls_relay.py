"""A loopback TCP relay that can stop and start again on its port, optionally behind TLS with a
certificate authority made for the test, so a client meets refused connections, a server that comes
up late or goes away for a while, and certificates it does not trust, over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
import threading
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

if TYPE_CHECKING:
    from typing_extensions import Self


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_authority(folder: Path) -> tuple[Path, ssl.SSLContext]:
    """A new certificate authority's certificate (``ca.pem`` in ``folder``, what a client would
    trust) and a server context presenting a certificate it signed for 127.0.0.1 and localhost."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("torchdata-gcs test CA"))
        .issuer_name(_name("torchdata-gcs test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )  # digital signature, certificate and CRL signing
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file, chain_file, key_file = folder / "ca.pem", folder / "server.pem", folder / "server-key.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(chain_file, key_file)
    return ca_file, server


class Relay:
    """Forwards every connection on a loopback port to ``upstream`` (``http://host:port``), speaking TLS
    with ``tls`` to the client if given. :attr:`connections` counts the connections accepted (TLS
    handshakes that failed included). :meth:`stop` refuses new connections and cuts the open ones;
    :meth:`start` serves again on the same port (``port``, else a free one chosen at the first start)."""

    def __init__(self, upstream: str, *, tls: ssl.SSLContext | None = None, port: int = 0) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._tls = tls
        self.port = port
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-relay", daemon=True)
        self._thread.start()
        self._server: asyncio.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"{'https' if self._tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> Self:
        async def serve() -> asyncio.Server:
            return await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)

        self._server = asyncio.run_coroutine_threadsafe(serve(), self._loop).result(timeout=10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def close(server: asyncio.Server) -> None:
            server.close()
            # Every connection's task, one accepted but not started yet too: cancelled, it closes its sockets.
            running = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

        server, self._server = self._server, None
        if server is not None:
            asyncio.run_coroutine_threadsafe(close(server), self._loop).result(timeout=10)

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.run_until_complete(asyncio.sleep(0))  # what closing transports left to do
        self._loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        upstream: asyncio.StreamWriter | None = None
        try:
            if self._tls is not None:
                await writer.start_tls(self._tls)
            upstream_reader, upstream = await asyncio.open_connection(*self._upstream)
            await asyncio.gather(_pump(reader, upstream), _pump(upstream_reader, writer))
        except (OSError, ssl.SSLError, asyncio.CancelledError):
            pass  # a refused handshake, a closed peer, or stop(): the connection just ends
        finally:
            for stream in (writer, upstream):
                if stream is not None:  # cut, not closed: a TLS close waits up to 30 s for the peer's answer
                    stream.transport.abort()


async def _pump(source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
    while data := await source.read(65536):
        target.write(data)
        await target.drain()
    if target.can_write_eof():  # TLS has no half-close: the connection then ends when both sides have
        with contextlib.suppress(OSError):
            target.write_eof()
