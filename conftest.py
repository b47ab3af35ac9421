"""Collection rules for the whole checkout: modules that need an optional dependency this environment lacks are
not collected for their doctests (``torchdata_gcs.nodes`` needs torchdata 0.10+, tested in the second environment)."""

import importlib.util

try:
    _has_nodes = importlib.util.find_spec("torchdata.nodes") is not None
except ImportError:  # no torchdata at all
    _has_nodes = False

collect_ignore = [] if _has_nodes else ["torchdata_gcs/nodes.py"]
