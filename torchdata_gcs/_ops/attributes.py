"""What an object carries besides its bytes and that a writer may set: its content type, user metadata and
the fixed-key metadata GCS keeps (cache control, content disposition, encoding and language, custom time),
checked once and spelled both ways GCS takes them: JSON resource fields, and XML API request headers."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FIXED_KEYS", "ObjectAttributes", "fixed_fields", "kms_key", "user_metadata"]

FIXED_KEYS = {
    "cache_control": "cacheControl",
    "content_disposition": "contentDisposition",
    "content_encoding": "contentEncoding",
    "content_language": "contentLanguage",
    "custom_time": "customTime",
}
"""gcsfs's ``fixed_key_metadata`` keys and the object resource fields they set."""

_XML_HEADERS = {
    "cacheControl": "Cache-Control",
    "contentDisposition": "Content-Disposition",
    "contentEncoding": "Content-Encoding",
    "contentLanguage": "Content-Language",
    "customTime": "x-goog-custom-time",
}

_HEADER_KEY = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]+")


def fixed_fields(fixed_key_metadata: Mapping[str, Any] | None, *, removable: bool = False) -> dict[str, str | None]:
    """``fixed_key_metadata`` (gcsfs's snake_case keys, or the resource's camelCase ones) as resource fields;
    ``TypeError`` naming a key GCS does not take or a value that is not a str (``None`` too, if
    ``removable``: it clears the field in a patch)."""
    if fixed_key_metadata is None:
        return {}
    if not isinstance(fixed_key_metadata, Mapping):
        raise TypeError(f"fixed_key_metadata must be a dict, got {type(fixed_key_metadata).__name__}")
    camel = {resource: resource for resource in FIXED_KEYS.values()}
    unknown = sorted(str(key) for key in fixed_key_metadata if key not in FIXED_KEYS and key not in camel)
    if unknown:
        raise TypeError(f"fixed_key_metadata takes {', '.join(FIXED_KEYS)}; not {', '.join(unknown)}")
    fields = {FIXED_KEYS.get(key, key): value for key, value in fixed_key_metadata.items()}
    _check_values("fixed_key_metadata", fields, removable)
    return fields


def user_metadata(metadata: Mapping[str, Any] | None, *, removable: bool = False) -> dict[str, str | None]:
    """User metadata as GCS takes it: str keys and str values (``None`` too, if ``removable``: it removes the
    key in a patch); ``TypeError`` otherwise."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a dict of str to str, got {type(metadata).__name__}")
    _check_values("metadata", dict(metadata), removable)
    return dict(metadata)


def kms_key(name: Any) -> str | None:
    """A Cloud KMS key's resource name (``projects/P/locations/L/keyRings/R/cryptoKeys/K``) as given, or
    ``None``; ``TypeError`` for anything but a non-empty str or ``None``."""
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"kms_key_name must be a non-empty str or None, got {name!r}")
    return name


def _check_values(what: str, values: Mapping[Any, Any], removable: bool) -> None:
    for key, value in values.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"{what} keys must be non-empty str, got {key!r}")
        if not (isinstance(value, str) or (removable and value is None)):
            allowed = "a str or None" if removable else "a str"
            raise TypeError(f"{what}[{key!r}] must be {allowed}, got {type(value).__name__}")


@dataclass(frozen=True)
class ObjectAttributes:
    """A new object's content type, user ``metadata``, fixed-key ``fixed`` (resource field names), and the
    Cloud KMS key that encrypts it (``kms_key_name``, a key's resource name; ``None``: the bucket's default)."""

    content_type: str = "application/octet-stream"
    metadata: Mapping[str, str] = field(default_factory=dict)
    fixed: Mapping[str, str] = field(default_factory=dict)
    kms_key_name: str | None = None

    @classmethod
    def of(
        cls,
        content_type: str,
        metadata: Mapping[str, Any] | None = None,
        fixed_key_metadata: Mapping[str, Any] | None = None,
        kms_key_name: str | None = None,
    ) -> ObjectAttributes:
        """Checked attributes; ``TypeError`` for what GCS would not take (see :func:`user_metadata`)."""
        if not isinstance(content_type, str) or not content_type:
            raise TypeError(f"content_type must be a non-empty str, got {content_type!r}")
        return cls(
            content_type,
            user_metadata(metadata),  # type: ignore[arg-type]  # not removable: no value is None
            fixed_fields(fixed_key_metadata),  # type: ignore[arg-type]  # as above
            kms_key(kms_key_name),
        )

    def fields(self) -> dict[str, Any]:
        """The JSON resource fields these attributes set, but ``contentType``."""
        return {**({"metadata": dict(self.metadata)} if self.metadata else {}), **self.fixed}

    def xml_headers(self) -> dict[str, str] | None:
        """The same as XML API request headers (``Content-Type``, ``x-goog-meta-*``, ...), or ``None`` where a
        header cannot carry them as they are: a value not printable ASCII, or a metadata key that is not a
        lower-case header token (header names ignore case; the JSON API keeps any UTF-8 key and value)."""
        if not all(_HEADER_KEY.fullmatch(key) for key in self.metadata):
            return None
        headers = {"Content-Type": self.content_type}
        headers.update({_XML_HEADERS[key]: value for key, value in self.fixed.items()})
        headers.update({f"x-goog-meta-{key}": value for key, value in self.metadata.items()})
        if self.kms_key_name is not None:
            headers["x-goog-encryption-kms-key-name"] = self.kms_key_name
        if not all(value.isascii() and value.isprintable() for value in headers.values()):
            return None
        return headers
