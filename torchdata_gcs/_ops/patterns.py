"""Which object names a listed input stands for: globs in URLs and masks, as fsspec and gcsfs read them.

``*`` matches within one level of ``/``, ``**`` across levels (``a/**/b`` includes ``a/b``), ``?``
one character, ``[...]`` a set; ``[*]`` is a literal ``*``. A mask without ``/`` matches an object's
base name (fnmatch, as torch's file listers match masks); a mask with ``/`` is a glob on the name
below the listed prefix. :func:`server_glob` turns what a filter keeps into a GCS ``matchGlob`` that
selects at least as much, so GCS sends fewer names. Pure functions, no I/O.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

from fsspec.utils import glob_translate

__all__ = ["NameFilter", "glob_root", "has_magic", "server_glob", "tree_glob"]

_MAGIC = re.compile(r"[*?\[]")
_UNSURE = re.compile(r"[\\{},\]]")  # special to GCS, or read differently by it: never sent
_CLASS = re.compile(r"\[(!?)([^\[\]\\/!^]+)\]")  # a set of plain characters, negated with ``!``
_SUPER_STAR = re.compile(r"\*{2,}")


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

    @property
    def keeps_all(self) -> bool:
        """Whether every name is kept: no glob, no mask."""
        return self.glob is None and not self.base_masks and not self.path_masks

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


def server_glob(keep: NameFilter, name: str, masks: Sequence[str] = ()) -> str | None:
    """A GCS ``matchGlob`` that selects every name ``keep`` (``NameFilter.of(name, masks)``) keeps, or
    ``None`` when none can be sure to (GCS's globs are not fnmatch's nor fsspec's).

    GCS reads ``*`` within one level of ``/`` and ``**`` across levels, also next to other characters
    (``foo**bar`` selects ``foo/bar``); ``?``, ``[...]``, ``[!...]``, ``{a,b}`` and ``\\`` have meanings of
    their own. So a mask on the base name becomes ``ROOT**MASK`` (any depth, then the base name), a
    ``/**/`` level becomes ``/**`` (its own level may be empty), and anything GCS might read otherwise (a
    backslash, braces, commas, a lone ``]``, a set holding ``/`` or a range across it, a negated set
    that fsspec would let match ``/``) sends none. The glob may select more; the filter still decides.

    >>> server_glob(NameFilter.of("train/", ["*.jpg"]), "train/", ["*.jpg"])
    'train/**.jpg'
    >>> server_glob(NameFilter.of("data/**/shard-[0-9]*.tar"), "data/**/shard-[0-9]*.tar")
    'data/**shard-[0-9]*.tar'
    >>> server_glob(NameFilter.of("a/", ["x[!0].bin", "y/*.txt"]), "a/", ["x[!0].bin", "y/*.txt"])
    '{a/**x[!0].bin,a/y/*.txt}'
    >>> [server_glob(NameFilter.of("a/", [mask]), "a/", [mask]) for mask in ("*", "x{1,2}", "[!x]/b")]
    [None, None, None]
    """
    if keep.glob is not None:
        return _path_glob(name, negation=False)
    if not masks or "" in masks:
        return None
    pieces = [
        _path_glob(mask, negation=False, root=keep.root)
        if "/" in mask
        else _path_glob(mask.lstrip("*"), negation=True, root=keep.root + "**")
        for mask in masks
    ]
    if any(piece is None or piece == keep.root + "**" for piece in pieces):
        return None  # a mask that GCS could not be sure to read alike, or one that keeps everything
    return pieces[0] if len(pieces) == 1 else "{" + ",".join(sorted(set(pieces))) + "}"  # type: ignore[arg-type]  # pieces are strings; None was handled above


def tree_glob(glob: str) -> str | None:
    """A GCS ``matchGlob`` that selects every name the fsspec glob ``glob`` selects and every name under a
    folder it selects (fsspec's ``glob`` yields folders too), or ``None`` (see :func:`server_glob`).

    >>> tree_glob("data/*.parquet"), tree_glob("data/*/"), tree_glob("data/x{1}*")
    ('data/*.parquet**', 'data/*/**', None)
    """
    keep = NameFilter.of(glob)
    below = server_glob(keep, glob)
    if below is None or keep.glob is None:
        return None
    narrowed = _SUPER_STAR.sub("**", below + "**")
    return None if narrowed == keep.root + "**" else narrowed


def _path_glob(pattern: str, *, negation: bool, root: str = "") -> str | None:
    """``root`` (literal, or ending in ``**``) and then ``pattern`` as GCS's glob of at least the same
    names, or ``None``; ``negation``: whether ``[!...]`` may stay (in a base name, where no ``/`` is)."""
    literal_root = root.removesuffix("**")
    if _UNSURE.search(literal_root + pattern.replace("[", "").replace("]", "")) or has_magic(literal_root):
        return None
    text = _CLASS.sub("", pattern)
    if "[" in text or "]" in text or "!" in text:
        return None  # a set GCS may read otherwise (empty, nested, holding ``/`` or ``^``), or a lone ``!``
    for negated, chars in _CLASS.findall(pattern):
        if negated and not negation or chars[0] == "-" or chars[-1] == "-":
            return None
        if any(low <= "/" <= high for low, high in re.findall(r"(.)-(.)", chars)):
            return None
    levels = pattern.split("/")
    glob = ""
    for index, level in enumerate(levels):
        last = index == len(levels) - 1
        if level == "**":
            glob += "**"  # ``a/**/b`` is ``a/`` then ``b`` at any depth: ``a/**b``
        else:
            glob += level + ("" if last else "/")
    return _SUPER_STAR.sub("**", root + glob)
