"""Test helpers: the embedded GCS emulator, a GCS-like front for it, and pytest fixtures.

Use :class:`Emulator` directly as a context manager, or load the fixtures in a ``conftest.py``:

    pytest_plugins = ["torchdata_gcs.testing.fixtures"]

which provides ``gcs_emulator`` (one emulator per test session) and ``gcs_bucket`` (a new, empty
bucket per test). Put a :class:`GCSFront` before the emulator to hold it to GCS's rules (XML
multipart upload, preconditions, composite objects, only the headers GCS promises), to add latency,
bandwidth caps and injected faults (throttling, outages, resets, cut or damaged bodies, stalls, lost
answers to writes carried out, GCS's per-bucket request-rate ramp), and to count and record requests.
"""

from ._emulator import Emulator, EmulatorError
from ._faults import FAULT_KINDS, Fault
from ._front import GCSFront
from ._latency import LatencyFront
from ._rate_ramp import RateRamp
from ._request_kinds import REQUEST_KINDS
from ._request_log import RecordedRequest

__all__ = [
    "Emulator",
    "EmulatorError",
    "FAULT_KINDS",
    "Fault",
    "GCSFront",
    "LatencyFront",
    "REQUEST_KINDS",
    "RateRamp",
    "RecordedRequest",
]
