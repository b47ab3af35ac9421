"""The Python blocks of README.md and docs/, for tests that run them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# A block, and the skip mark that may precede it: <!-- docs-test: skip: <reason> -->
FENCE = re.compile(r"(?:<!-- docs-test: skip: (?P<skip>.+?) -->\n)?^```python\n(?P<code>.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    code: str
    skip: str | None


def blocks_of(page: Path) -> list[Block]:
    """``page``'s Python blocks in order, each with the line its code starts on."""
    text = page.read_text()
    name = str(page.relative_to(ROOT))
    return [
        Block(name, text.count("\n", 0, match.start("code")) + 1, match.group("code"), match.group("skip"))
        for match in FENCE.finditer(text)
    ]


def doc_block(containing: str) -> str:
    """The one Python block of README.md or docs/ that contains ``containing``."""
    (block,) = [block.code for page in PAGES for block in blocks_of(page) if containing in block.code]
    return block
