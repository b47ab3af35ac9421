"""Collection rules for the whole checkout.

Modules that need an optional dependency this environment lacks are not collected for their doctests
(``torchdata_gcs.nodes`` needs torchdata 0.10+, tested in the second environment).

What needs HAProxy with Lua (``LatencyFront``) is skipped, with the reason, where it is missing: the tests
marked ``haproxy`` and the doctests that start a ``LatencyFront``. ``TORCHDATA_GCS_REQUIRE_HAPROXY=1``
(set by CI, which installs HAProxy) makes them fail there instead.

Ctrl-C is as a terminal gives it, even where the run was started in the background of a shell, which starts
it with SIGINT ignored (its children would inherit that): the tests that press Ctrl-C need it.
"""

from __future__ import annotations

import importlib.util
import os
import signal

import pytest

try:
    _has_nodes = importlib.util.find_spec("torchdata.nodes") is not None
except ImportError:  # no torchdata at all
    _has_nodes = False

collect_ignore = [] if _has_nodes else ["torchdata_gcs/nodes.py"]

REQUIRE_HAPROXY = "TORCHDATA_GCS_REQUIRE_HAPROXY"


def pytest_configure(config: pytest.Config) -> None:
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    config.addinivalue_line(
        "markers",
        f"haproxy: needs HAProxy with Lua (LatencyFront); skipped where it is missing, unless {REQUIRE_HAPROXY} is set",
    )


def _needs_haproxy(item: pytest.Item) -> bool:
    if item.get_closest_marker("haproxy") is not None:
        return True
    examples = getattr(getattr(item, "dtest", None), "examples", [])  # a doctest's examples
    return any("LatencyFront(" in example.source for example in examples)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if not _needs_haproxy(item):
        return
    from torchdata_gcs.testing import LatencyFront

    reason = LatencyFront.unavailable_reason()
    if reason is None:
        return
    if os.environ.get(REQUIRE_HAPROXY):
        pytest.fail(f"{reason}, and {REQUIRE_HAPROXY} says what needs it must run")
    pytest.skip(f"{reason}; the latency front needs it")
