"""What reaching an endpoint means, the same for every transport: the certificates an https endpoint is
checked against, the proxy the environment names for it, which endpoints have answered in this process,
and what to say of an endpoint that cannot be trusted or reached. It imports nothing of the package, so
the transports that use it stay shallow."""

from __future__ import annotations

import os
import re
import ssl
import urllib.request
from urllib.parse import urlsplit

__all__ = ["answered", "proxy_for", "trusted_certificates", "unreachable", "untrusted", "verify_failure"]

answered: set[str] = set()
"""Endpoints that have answered in this process, or in the parent it was forked from: their refused
connections are network faults, retried, not a wrong endpoint."""

_BUNDLE_ENVS = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


def trusted_certificates() -> tuple[ssl.SSLContext, str]:
    """The certificates an https endpoint is checked against, and where to add one: the bundle that
    ``REQUESTS_CA_BUNDLE`` (else ``CURL_CA_BUNDLE``) names, as requests, and so the official client, take
    it; else the system's, where ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` point when the session is made.
    A bundle that cannot be used raises ``ValueError`` saying why."""
    named = next((name for name in _BUNDLE_ENVS if os.environ.get(name)), None)
    if named is None:
        hint = "add its CA certificate to the bundle that SSL_CERT_FILE names, or name one in REQUESTS_CA_BUNDLE"
        return ssl.create_default_context(), hint
    bundle = os.environ[named]
    order = "" if named == "REQUESTS_CA_BUNDLE" else "; REQUESTS_CA_BUNDLE, over both"
    hint = f"add its CA certificate to {bundle}, which {named} names (it takes precedence over SSL_CERT_FILE{order})"
    try:
        if os.path.isdir(bundle):
            return ssl.create_default_context(capath=bundle), hint
        return ssl.create_default_context(cafile=bundle), hint
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"the CA bundle {bundle}, which {named} names, cannot be used: {exc}") from None


def verify_failure(text: str) -> str:
    """OpenSSL's reason in a verification error's text (``self-signed certificate``...), else the text."""
    match = re.search(r"certificate verify failed: ([^(]+?)\s*\(", text)
    return match.group(1) if match else text


def proxy_for(endpoint: str) -> str | None:
    """The proxy the environment names for ``endpoint`` (``HTTPS_PROXY``, ``NO_PROXY``...), else ``None``;
    resolved once per transport (re-reading the environment on every request costs)."""
    parts = urlsplit(endpoint)
    proxies = urllib.request.getproxies()
    bypass = urllib.request.proxy_bypass(parts.hostname or "") if proxies else True
    return None if bypass else proxies.get(parts.scheme)


def untrusted(where: str, reason: str, trust_hint: str) -> str:
    """What to say of ``where`` (the endpoint, or its proxy) whose certificate failed verification for
    ``reason`` (an ``EndpointError`` at once: no new attempt trusts it)."""
    return (
        f"cannot trust {where}: its TLS certificate failed verification ({verify_failure(reason)}); "
        f"if a proxy or firewall on the way intercepts TLS, {trust_hint}"
    )


def unreachable(where: str, cause: str, check: str) -> str:
    """What to say of ``where`` that could not be connected to, for ``cause``; ``check`` says what to look at."""
    return f"cannot reach {where}: {cause}; {check}"
