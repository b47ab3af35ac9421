"""Test helpers: the embedded GCS emulator and pytest fixtures for it.

Use :class:`Emulator` directly as a context manager, or load the fixtures in a ``conftest.py``::

    pytest_plugins = ["torchdata_gcs.testing.fixtures"]

which provides ``gcs_emulator`` (one emulator per test session) and ``gcs_bucket`` (a new, empty
bucket per test).
"""

from ._emulator import Emulator, EmulatorError

__all__ = ["Emulator", "EmulatorError"]
