"""The filesystem's constructor arguments: fsspec's own, and gcsfs's, translated to a ``ClientConfig`` or
refused by name rather than ignored; and the project a filesystem made without ``project=`` belongs to, as
gcsfs finds it."""

from __future__ import annotations

import json
import os
from typing import Any

import google.auth
import google.auth.credentials
import google.auth.exceptions
from fsspec.registry import available_protocols

from .._ops.client import GCSClient
from ..config import ClientConfig

__all__ = ["GCSFS_ONLY", "PROJECT_VARIABLE", "client_from_gcsfs_options", "default_project", "listings_cache_options"]

FSSPEC_OPTIONS = frozenset(
    {"asynchronous", "loop", "batch_size", "skip_instance_cache", "use_listings_cache", "listings_expiry_time",
     "max_paths"}
)  # fmt: skip
"""The keyword arguments fsspec's own filesystem classes take."""

GCSFS_ONLY = frozenset(
    {"MIN_CHUNK_SIZE_FOR_CONCURRENCY", "base", "batch_url_base", "call", "close_session", "default_block_size",
     "grpc_client", "make_bucket_requester_pays", "retries", "scopes", "session",
     "sync_process_limits_to_offset_and_length"}
)  # fmt: skip
"""gcsfs's public names that have no counterpart here: asked for, they raise an ``AttributeError`` that
points to the compatibility table, which says what to use instead."""

PROJECT_VARIABLE = "GCSFS_DEFAULT_PROJECT"
"""gcsfs's environment variable naming the project when ``project=`` is not given."""

CONSISTENCY = frozenset({"none", "size", "md5", "crc32c"})
"""gcsfs's ``consistency`` values; reads here are always checked by crc32c, which covers them all."""


def listings_cache_options(options: dict[str, Any]) -> None:
    """gcsfs's ``cache_timeout`` in ``options`` as fsspec's listings cache options: ``None`` (gcsfs's
    default) caches listings until invalidated, seconds expire them, 0 or less caches none."""
    if "cache_timeout" not in options:
        return
    timeout = options.pop("cache_timeout")
    if "listings_expiry_time" in options:
        raise TypeError("give either gcsfs's cache_timeout or fsspec's listings_expiry_time, not both")
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"cache_timeout must be seconds or None, got {timeout!r}")
    if timeout <= 0:
        options["use_listings_cache"] = False
    else:
        options["listings_expiry_time"] = timeout


def default_project(config: ClientConfig) -> str | None:
    """The project of a filesystem made without ``project=``, as gcsfs finds it: ``GCSFS_DEFAULT_PROJECT``, else
    the project the credentials of ``config`` belong to (a service-account key's, a credentials object's, or the
    one Application Default Credentials name, as ``google.auth.default()`` finds it); ``None`` if none does
    (anonymous access has no credentials)."""
    if os.environ.get(PROJECT_VARIABLE):
        return os.environ[PROJECT_VARIABLE]
    if config.anonymous:
        return None
    if config.credentials is not None:
        return getattr(config.credentials, "project_id", None) or getattr(config.credentials, "quota_project_id", None)
    if config.credentials_file:
        try:
            with open(config.credentials_file) as key:
                document = json.load(key)
        except (OSError, ValueError):  # its first request says what is wrong with it
            return None
        return (document.get("project_id") or document.get("quota_project_id")) if isinstance(document, dict) else None
    try:
        return google.auth.default()[1]
    except (google.auth.exceptions.DefaultCredentialsError, ValueError):
        return None


def client_from_gcsfs_options(
    client: GCSClient | ClientConfig | None, options: dict[str, Any]
) -> GCSClient | ClientConfig | None:
    """``client`` with gcsfs's arguments in ``options`` applied (and taken out of it); any other argument
    that fsspec does not take raises ``TypeError`` naming it: ignoring ``token`` or ``endpoint_url`` would
    send requests elsewhere than meant. Dropped, as gcsfs leaves them unused: an argument named after another
    fsspec protocol, which holds that protocol's options (fsspec's form for chained URLs; Hugging Face
    ``datasets`` adds ``hf`` to the options it is given), and ``client_kwargs``, an HTTP client's settings that
    ``datasets`` hands every filesystem it opens a compressed file on (here proxies always come from the
    environment)."""
    gcsfs = {key: options.pop(key) for key in ("token", "endpoint_url", "project", "requester_pays", "consistency")
             if key in options}  # fmt: skip
    for key in set(options) & ({"client_kwargs"} | (set(available_protocols()) - {"gs", "gcs"})):
        del options[key]
    unknown = sorted(set(options) - FSSPEC_OPTIONS)
    if unknown:
        raise TypeError(f"GCSFileSystem got arguments it does not take: {', '.join(unknown)}")
    if not gcsfs.keys() - {"project"}:  # the project alone is the filesystem's (its buckets), not the client's
        return client
    if client is not None:
        raise TypeError(f"give either client= or gcsfs's {', '.join(sorted(gcsfs))}, not both")
    consistency = gcsfs.get("consistency", "crc32c")
    if consistency not in CONSISTENCY:
        raise ValueError(f"consistency must be one of {sorted(CONSISTENCY)}, got {consistency!r}")
    settings: dict[str, Any] = {}
    if gcsfs.get("endpoint_url") is not None:
        settings["endpoint"] = gcsfs["endpoint_url"]
    token = gcsfs.get("token")
    if token == "anon":
        settings["anonymous"] = True
    elif isinstance(token, (str, os.PathLike)) and token not in ("google_default", "cloud"):
        if not os.path.isfile(token):
            raise ValueError(f"token {token!r} is neither 'anon', 'google_default', 'cloud' nor a credentials file")
        settings["credentials_file"] = os.fspath(token)
    elif isinstance(token, google.auth.credentials.Credentials):
        settings["credentials"] = token
    elif token is not None and token not in ("google_default", "cloud"):
        raise TypeError(f"token must be 'anon', 'google_default', 'cloud', a file path or Credentials, got {token!r}")
    payer = gcsfs.get("requester_pays", False)
    if payer is True:
        project = gcsfs.get("project") or default_project(ClientConfig(**settings))
        if not project:
            raise ValueError(
                f"requester_pays=True bills project=, which is missing (nor does {PROJECT_VARIABLE} or the "
                "credentials name one)"
            )
        settings["user_project"] = project
    elif isinstance(payer, str) and payer:
        settings["user_project"] = payer
    return ClientConfig(**settings)
