"""The ``torchdata-gcs`` command: argument parsing and exit codes in :mod:`.main`, the bucket check in
:mod:`.doctor`, the measurements in :mod:`.bench`."""

from .main import main

__all__ = ["main"]
