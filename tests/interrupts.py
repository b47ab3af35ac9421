"""Ctrl-C in a test: SIGINT to the main thread while the code under test waits there."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def ctrl_c_after(seconds: float) -> Iterator[None]:
    """Expect ``KeyboardInterrupt`` from the block, sent as a real SIGINT ``seconds`` in; the block must
    give way within 30 s (its own waits are longer: only the interruption ends it)."""
    main = threading.main_thread().ident
    assert main is not None and threading.current_thread() is threading.main_thread()
    timer = threading.Timer(seconds, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        timer.cancel()
    assert time.monotonic() - started < 30
