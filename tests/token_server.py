"""A local OAuth token endpoint and service-account key files, so real credentials flow offline."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ACCESS_TOKEN = "ya29.SECRET-ACCESS-TOKEN"


def private_key_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


class TokenServer:
    """A local OAuth token endpoint, so real service-account credentials flow offline.

    It hands out ACCESS_TOKEN and counts grants; with ``refuse`` set it answers 400
    ``invalid_grant``, as Google does for a deleted or disabled key.
    """

    def __init__(self) -> None:
        self.grants = 0
        self.refuse = False
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if owner.refuse:
                    status, answer = 400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
                else:
                    owner.grants += 1
                    status, answer = 200, {"access_token": ACCESS_TOKEN, "expires_in": 3600, "token_type": "Bearer"}
                body = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self._server.server_address[1]}/token"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def write_key_file(self, path: Path, private_key: str) -> str:
        path.write_text(
            json.dumps(
                {
                    "type": "service_account",
                    "project_id": "test-project",
                    "private_key_id": "key-id-1",
                    "private_key": private_key,
                    "client_email": "loader@test-project.iam.gserviceaccount.com",
                    "client_id": "1234",
                    "token_uri": self.uri,
                }
            )
        )
        return str(path)
