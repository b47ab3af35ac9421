"""The README's Python blocks, for tests that run them."""

from __future__ import annotations

import re
from pathlib import Path


def readme_block(containing: str) -> str:
    """The README's one Python block that contains ``containing``."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (block,) = [block for block in re.findall(r"```python\n(.*?)```", readme, re.DOTALL) if containing in block]
    return block
