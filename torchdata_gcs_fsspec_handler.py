"""Which filesystem fsspec gives ``gs://`` and ``gcs://`` URLs, decided the same way in every process.

torchdata-gcs names this module's ``GSFileSystem`` in fsspec's ``fsspec.specs`` entry-point group for
both protocols. fsspec reads that group at ``import fsspec`` in every process, spawned and forkserver
workers included, and looks the attribute up at the protocol's first use there; :func:`choose` then
picks by the environment, which child processes inherit:

- ``TORCHDATA_GCS_FSSPEC=1`` (what ``torchdata_gcs.fsspec.register()`` sets): torchdata_gcs's
  ``GCSFileSystem``, also where gcsfs is installed;
- ``TORCHDATA_GCS_FSSPEC=0``: gcsfs, as if torchdata-gcs were not installed;
- unset or empty: gcsfs if it is installed, so nothing changes for its users; torchdata_gcs's
  ``GCSFileSystem`` otherwise (where fsspec alone would raise ``ImportError``).

This module lives outside the package and imports only the choice, so a process that uses gcsfs
never imports torchdata_gcs (nor torch) through it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Mapping

__all__ = ["VARIABLE", "choose", "handler"]

VARIABLE = "TORCHDATA_GCS_FSSPEC"
"""The environment variable that says which filesystem serves ``gs://``: ``1`` ours, ``0`` gcsfs."""

OURS = "torchdata_gcs.fsspec"
GCSFS = "gcsfs"


def choose(environ: Mapping[str, str], gcsfs_installed: bool) -> str:
    """The module whose ``GCSFileSystem`` serves ``gs://`` given ``environ``: ``"torchdata_gcs.fsspec"``
    or ``"gcsfs"``, by the rule above.

    Raises:
        ValueError: the variable holds something other than ``1``, ``0`` or nothing.
        ImportError: it asks for gcsfs, which is not installed (as fsspec would say without us).

    Example:
        >>> choose({}, gcsfs_installed=True), choose({}, gcsfs_installed=False)
        ('gcsfs', 'torchdata_gcs.fsspec')
        >>> choose({"TORCHDATA_GCS_FSSPEC": "1"}, gcsfs_installed=True)
        'torchdata_gcs.fsspec'
    """
    value = environ.get(VARIABLE, "").strip()
    if not value:
        return GCSFS if gcsfs_installed else OURS
    if value == "1":
        return OURS
    if value != "0":
        raise ValueError(
            f"{VARIABLE}={value!r}: 1 serves gs:// with torchdata_gcs, 0 with gcsfs; unset picks gcsfs if installed"
        )
    if not gcsfs_installed:
        raise ImportError(
            f"{VARIABLE}=0 asks for gcsfs, which is not installed: pip install gcsfs, or unset {VARIABLE}"
        )
    return GCSFS


def handler() -> type:
    """The ``GCSFileSystem`` class :func:`choose` picks for this process's environment."""
    module = choose(os.environ, gcsfs_installed=importlib.util.find_spec(GCSFS) is not None)
    found: type = importlib.import_module(module).GCSFileSystem
    return found


def __getattr__(name: str) -> type:
    """``GSFileSystem``, the entry point's target, is decided when fsspec first asks for it."""
    if name == "GSFileSystem":
        return handler()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
