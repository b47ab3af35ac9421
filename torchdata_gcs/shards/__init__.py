"""WebDataset tar shards on GCS: read as samples, shuffled by shard and by buffer, and packed from objects.

A shard is a tar archive whose members are grouped into samples by key (``000123.jpg`` and ``000123.json``
are the sample ``000123``), as WebDataset writes them; beside each shard an index of member offsets
(``shard.tar.idx``) allows reading one sample with one ranged GET.
"""

from __future__ import annotations

from .datasets import ShardDataset, ShardMapDataset
from .pack import PackReport, pack

__all__ = ["PackReport", "ShardDataset", "ShardMapDataset", "pack"]
