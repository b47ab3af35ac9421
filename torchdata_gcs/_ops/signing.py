"""V4 signed URLs of one object: a canonical request, its SHA-256 in a string to sign, that string signed
with GOOG4-RSA-SHA256 by a service account's private key, as GCS's "V4 signing process" describes. Pure
computation, no request: anyone holding the URL may then make that one request until it expires. And the
credentials a client's settings sign with."""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

import google.auth.credentials
import google.auth.crypt

from .._transport.http import credentials_for
from ..config import ClientConfig
from ..errors import AccessDeniedError

__all__ = ["ALGORITHM", "MAX_EXPIRATION", "expiration_seconds", "signed_url", "signing_credentials"]

ALGORITHM = "GOOG4-RSA-SHA256"
MAX_EXPIRATION = 7 * 24 * 3600
"""GCS refuses a V4 signed URL meant to last longer than seven days."""


def expiration_seconds(expiration: int | datetime.timedelta | datetime.datetime, now: datetime.datetime) -> int:
    """Seconds a URL signed at ``now`` stays valid: ``expiration`` is seconds, a ``timedelta``, or the moment
    it ends (a naive ``datetime`` is UTC); ``ValueError`` outside 1 s to seven days, as GCS takes."""
    if isinstance(expiration, datetime.datetime):
        ends = expiration if expiration.tzinfo else expiration.replace(tzinfo=datetime.timezone.utc)
        expiration = ends - now
    if isinstance(expiration, datetime.timedelta):
        seconds = int(expiration.total_seconds())
    elif isinstance(expiration, int) and not isinstance(expiration, bool):
        seconds = expiration
    else:
        raise TypeError(f"expiration must be seconds, a timedelta or a datetime, got {type(expiration).__name__}")
    if not 1 <= seconds <= MAX_EXPIRATION:
        raise ValueError(f"a signed URL lasts 1 to {MAX_EXPIRATION} seconds (seven days), asked {seconds}")
    return seconds


def signing_credentials(config: ClientConfig) -> google.auth.credentials.Credentials:
    """The credentials URLs are signed with for a client of ``config``: its credentials object or key file's,
    else Application Default Credentials; anonymous access holds no private key (``AccessDeniedError``)."""
    if config.anonymous:
        raise AccessDeniedError("an anonymous client cannot sign URLs: it holds no private key")
    return credentials_for(config)


def _encoded(text: object) -> str:
    """Percent-encoding of a query name or value: every byte but the unreserved characters of RFC 3986."""
    return quote(str(text), safe="~")


def signed_url(
    credentials: google.auth.credentials.Credentials,
    endpoint: str,
    bucket: str,
    name: str,
    *,
    expiration: int | datetime.timedelta | datetime.datetime,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    query: Mapping[str, Any] | None = None,
    now: datetime.datetime | None = None,
) -> str:
    """A V4 signed URL of object ``name`` of ``bucket`` on ``endpoint`` (path style), for a request of
    ``method`` (``"RESUMABLE"``: the POST that starts a resumable upload) carrying exactly ``headers`` (and
    ``Host``, signed too) and ``query`` (``generation``, ``response-content-type``, ...), valid for
    ``expiration`` from ``now`` (the current time if ``None``; a naive one is UTC).

    ``credentials`` must hold an RSA private key, as a service account's key file does; others raise
    ``AccessDeniedError``: user credentials cannot sign, and those that sign through the IAM API (impersonated,
    metadata server) would send a request of their own, with no deadline of ours."""
    signing = credentials if isinstance(credentials, google.auth.credentials.Signing) else None
    signer = getattr(signing, "signer", None)
    if signing is None or not isinstance(signer, google.auth.crypt.RSASigner):
        raise AccessDeniedError(
            f"cannot sign a URL with {type(credentials).__name__}: V4 signing needs a service account's "
            "private key (token=, ClientConfig.credentials or credentials_file of a service-account key)"
        )
    now = now or datetime.datetime.now(datetime.timezone.utc)
    now = now.astimezone(datetime.timezone.utc) if now.tzinfo else now.replace(tzinfo=datetime.timezone.utc)
    timestamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    scope = f"{day}/auto/storage/goog4_request"

    pairs = list((headers or {}).items())
    if method.upper() == "RESUMABLE":  # a signed URL may only start a resumable upload, by this POST
        method, pairs = "POST", [*pairs, ("x-goog-resumable", "start")]
    if all(key.strip().lower() != "host" for key, _ in pairs):
        pairs.append(("host", urlsplit(endpoint).netloc))
    canonical_headers: dict[str, list[str]] = {}
    for key, value in pairs:
        canonical_headers.setdefault(key.strip().lower(), []).append(" ".join(str(value).split()))
    header_lines = "".join(f"{key}:{','.join(values)}\n" for key, values in sorted(canonical_headers.items()))
    signed_headers = ";".join(sorted(canonical_headers))

    parameters = {
        **{key: "" if value is None else value for key, value in (query or {}).items()},
        "X-Goog-Algorithm": ALGORITHM,
        "X-Goog-Credential": f"{signing.signer_email}/{scope}",
        "X-Goog-Date": timestamp,
        "X-Goog-Expires": expiration_seconds(expiration, now),
        "X-Goog-SignedHeaders": signed_headers,
    }
    canonical_query = "&".join(
        f"{key}={value}" for key, value in sorted((_encoded(k), _encoded(v)) for k, v in parameters.items())
    )
    resource = f"/{quote(bucket, safe='')}/{quote(name, safe='/~')}"
    payload = canonical_headers.get("x-goog-content-sha256", ["UNSIGNED-PAYLOAD"])[0]
    canonical_request = f"{method.upper()}\n{resource}\n{canonical_query}\n{header_lines}\n{signed_headers}\n{payload}"
    string_to_sign = "\n".join(
        [ALGORITHM, timestamp, scope, hashlib.sha256(canonical_request.encode("utf-8")).hexdigest()]
    )
    signature = signer.sign(string_to_sign.encode("utf-8")).hex()
    return f"{endpoint.rstrip('/')}{resource}?{canonical_query}&X-Goog-Signature={signature}"
