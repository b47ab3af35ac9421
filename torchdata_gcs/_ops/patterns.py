"""Which object names a listed input stands for: globs in URLs and masks, as fsspec and gcsfs read them.

``*`` matches within one level of ``/``, ``**`` across levels (``a/**/b`` includes ``a/b``), ``?``
one character, ``[...]`` a set; ``[*]`` is a literal ``*``. A mask without ``/`` matches an object's
base name (fnmatch, as torch's file listers match masks); a mask with ``/`` is a glob on the name
below the listed prefix. Pure functions, no I/O.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

from fsspec.utils import glob_translate

__all__ = ["NameFilter", "glob_root", "has_magic"]

_MAGIC = re.compile(r"[*?\[]")


def has_magic(name: str) -> bool:
    """Whether ``name`` holds a glob character (``*``, ``?`` or ``[``), so stands for many names.

    >>> has_magic("train/*.bin"), has_magic("train/0001.bin")
    (True, False)
    """
    return _MAGIC.search(name) is not None


def glob_root(name: str) -> str:
    """The longest folder prefix of a glob that holds no glob character: where its listing starts.

    >>> glob_root("train/shard-*/x.bin"), glob_root("*.bin")
    ('train/', '')
    """
    match = _MAGIC.search(name)
    head = name if match is None else name[: match.start()]
    return head[: head.rfind("/") + 1]


@dataclass(frozen=True)
class NameFilter:
    """Which names under ``root`` an input keeps: those the ``glob`` matches (if any) and at least one mask.

    >>> keep = NameFilter.of("train/**/*.bin", ["*0.bin", "b/*"])
    >>> keep.root, [keep("train/" + n) for n in ("a/10.bin", "11.bin", "b/11.bin", "a/10.txt")]
    ('train/', [True, False, True, False])
    """

    root: str
    glob: re.Pattern[str] | None
    base_masks: tuple[str, ...]  # fnmatch patterns on the base name
    path_masks: tuple[re.Pattern[str], ...]  # globs on the name below ``root``

    @classmethod
    def of(cls, name: str, masks: Sequence[str] = ()) -> NameFilter:
        """The filter of the input name ``name`` (a glob if :func:`has_magic`) and ``masks`` (none, or
        an empty one among them, keeps all)."""
        glob = re.compile(glob_translate(name)) if has_magic(name) else None
        root = glob_root(name) if glob is not None else (name if not name or name.endswith("/") else name + "/")
        masks = [] if "" in masks else masks
        return cls(
            root,
            glob,
            tuple(mask for mask in masks if "/" not in mask),
            tuple(re.compile(glob_translate(mask)) for mask in masks if "/" in mask),
        )

    def __call__(self, name: str) -> bool:
        if self.glob is not None and not self.glob.match(name):
            return False
        if not self.base_masks and not self.path_masks:
            return True
        base = name.rpartition("/")[2]
        if any(fnmatch.fnmatch(base, mask) for mask in self.base_masks):
            return True
        below = name.removeprefix(self.root)
        return any(mask.match(below) for mask in self.path_masks)
