"""Sizes as the subcommands print them: in binary units."""

from __future__ import annotations

__all__ = ["human_size"]


def human_size(size: float) -> str:
    """``size`` bytes in binary units.

    >>> human_size(0), human_size(1536), human_size(3 * 1024**4)
    ('0 B', '1.5 KiB', '3.0 TiB')
    """
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    power = 0
    while size >= 1024 and power < len(units) - 1:
        size /= 1024
        power += 1
    return f"{size:.0f} B" if power == 0 else f"{size:.1f} {units[power]}"
