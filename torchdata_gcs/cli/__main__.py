"""``python -m torchdata_gcs.cli``: the same as the ``torchdata-gcs`` command."""

import sys

from .main import main

sys.exit(main())
