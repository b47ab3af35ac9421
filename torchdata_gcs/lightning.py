"""Lightning checkpoints on GCS: a ``CheckpointIO`` plugin that saves, loads and removes ``gs://`` checkpoints
as :mod:`torchdata_gcs.checkpoint` does (streamed parallel upload, concurrent ranged reads, crc32c checks).

Needs Lightning (``pip install 'torchdata-gcs[lightning]'``); ``import torchdata_gcs`` never imports it.
Works with the ``lightning`` package and with the standalone ``pytorch_lightning``.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, cast

from ._engines import checkpoints
from ._engines.checkpoints import Strategy, write_config
from ._ops.client import Client, GCSClient, client_of
from ._ops.urls import parse_url
from .config import ClientConfig, RetryConfig, TransferConfig, WriteConfig, Zstd

try:
    from lightning.fabric.plugins.io import CheckpointIO, TorchCheckpointIO
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"torchdata_gcs.lightning needs Lightning: pip install 'torchdata-gcs[lightning]' ({exc})"
    ) from exc

__all__ = ["GCSCheckpointIO"]

logger = logging.getLogger(__name__)

_GCS_URL = re.compile(r"(?i)^gc?s:")
_OTHER_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]+://")  # two letters at least: C:\ stays a local path


def _keep_on_cpu(storage: Any, location: str) -> Any:
    """Lightning's default ``map_location``: every storage stays where ``torch.load`` put it, on the CPU."""
    return storage


class GCSCheckpointIO(CheckpointIO):
    """Lightning ``CheckpointIO`` that saves, loads and removes ``gs://`` checkpoints with this package.

    A save streams ``torch.save`` out in parallel parts and publishes the object only if it finished (a failed
    or interrupted save leaves nothing behind, not even a partial object or an open upload);
    a load reads concurrent ranges checked against GCS's crc32c. Local paths (such as the default
    ``ModelCheckpoint`` directory) go to Lightning's ``TorchCheckpointIO`` unchanged, so adding the plugin never
    breaks local checkpointing; other URL schemes raise ``ValueError``. Wrap it in Lightning's
    ``AsyncCheckpointIO`` to upload in the background.

    ``part_size``, ``max_parts_in_flight``, ``strategy`` and ``compression`` are deprecated: use ``write``.

    Args:
        client: a ``GCSClient`` (or the ``ClientConfig`` of one): where requests go and how they authenticate
            (default: ``STORAGE_EMULATOR_HOST``, else GCS with Application Default Credentials).
        retry: how transient failures are retried, for saves, loads and removals (in place of the client's own).
        transfer: how loads read (concurrency, range size; in place of the client's own).
        write: how saves stream out (:class:`~torchdata_gcs.WriteConfig`: ``strategy="compose"`` where the XML
            API is missing, ``compression="zstd"``); checked here, not at the first save. Loads detect
            compression by themselves.

    Examples:
        >>> import torch
        >>> from torchdata_gcs import testing
        >>> from torchdata_gcs.lightning import GCSCheckpointIO
        >>> with testing.Emulator() as emulator:
        ...     emulator.create_bucket("runs")
        ...     io = GCSCheckpointIO(client=emulator.client_config)
        ...     io.save_checkpoint({"epoch": 3, "state_dict": {"w": torch.ones(2)}}, "gs://runs/last.ckpt")
        ...     print(io.load_checkpoint("gs://runs/last.ckpt"))
        ...     io.remove_checkpoint("gs://runs/last.ckpt")
        ...     emulator.names("runs")
        {'epoch': 3, 'state_dict': {'w': tensor([1., 1.])}}
        []

    With a Trainer (``ckpt_path`` and ``save_checkpoint`` take ``gs://`` URLs as strings)::

        trainer = Trainer(plugins=[GCSCheckpointIO()])  # or AsyncCheckpointIO(GCSCheckpointIO())
        trainer.fit(model, ckpt_path="gs://bucket/run-1/last.ckpt")
        trainer.save_checkpoint("gs://bucket/run-1/last.ckpt")
    """

    def __init__(
        self,
        client: GCSClient | ClientConfig | None = None,
        retry: RetryConfig | None = None,
        transfer: TransferConfig | None = None,
        *,
        write: WriteConfig | None = None,
        part_size: int | None = None,
        max_parts_in_flight: int | None = None,
        strategy: Strategy | None = None,
        compression: str | Zstd | None = None,
    ) -> None:
        super().__init__()
        self.write = write_config(write, "GCSCheckpointIO", part_size=part_size,
                                  max_parts_in_flight=max_parts_in_flight, strategy=strategy,
                                  compression=compression)  # fmt: skip
        self.client = client_of(client, retry, transfer)
        self._gcs = Client(self.client)
        self._local = TorchCheckpointIO()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """``torch.save(checkpoint)`` to ``path``; a ``gs://`` object appears only once the whole save succeeded.

        Raises:
            TypeError: if ``storage_options`` is given (set save options on the plugin instead).
            ValueError: if ``path`` is neither ``gs://bucket/name`` nor a local path.
        """
        if storage_options is not None:
            raise TypeError(
                "`Trainer.save_checkpoint(..., storage_options=...)` with `storage_options` arg is not supported for "
                f"`{type(self).__name__}`: pass save options such as part_size to `{type(self).__name__}(...)` instead."
            )
        url = self._gcs_url(path)
        if url is None:
            self._local.save_checkpoint(checkpoint, path)
            return
        generation = checkpoints.save(checkpoint, url, self._gcs, self.write)
        logger.debug("saved checkpoint %s (generation %d)", url, generation)

    def load_checkpoint(
        self,
        path: Any,
        map_location: Any = _keep_on_cpu,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Load the checkpoint at ``path``, as Lightning's ``TorchCheckpointIO`` would: tensors on the CPU unless
        ``map_location`` says otherwise, ``weights_only=None`` meaning ``torch.load``'s own default.

        Raises:
            FileNotFoundError: if there is no checkpoint at ``path`` (``NotFoundError`` for ``gs://``).
        """
        url = self._gcs_url(path)
        if url is None:
            return self._local.load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        loaded = checkpoints.load(url, self._gcs, map_location=map_location, weights_only=weights_only)
        return cast(dict[str, Any], loaded)  # what Lightning saved: its checkpoint's dict

    def remove_checkpoint(self, path: Any) -> None:
        """Delete the checkpoint at ``path``; a missing one is no error, as with ``TorchCheckpointIO``."""
        url = self._gcs_url(path)
        if url is None:
            self._local.remove_checkpoint(path)
            return
        if checkpoints.remove(url, self._gcs):
            logger.debug("removed checkpoint %s", url)

    def teardown(self) -> None:
        """Nothing to release: connections belong to the process and are reused by later calls."""

    @staticmethod
    def _gcs_url(path: Any) -> str | None:
        """``path`` as a ``gs://`` URL, ``None`` for a local path; ``ValueError`` for anything else."""
        text = os.fspath(path) if isinstance(path, os.PathLike) else path
        if not isinstance(text, str):
            raise TypeError(f"expected a gs:// URL or a local path, got {type(path).__name__}: {path!r}")
        if _GCS_URL.match(text):
            if not text.startswith(("gs://", "gcs://")):
                hint = (
                    " (pathlib.Path turns '//' into '/': pass the URL as a str)"
                    if isinstance(path, os.PathLike)
                    else ""
                )
                raise ValueError(f"not a GCS URL (expected gs://bucket/name): {text!r}{hint}")
            parse_url(text, allow_prefix=False)  # InvalidURIError (a ValueError) before any work is done
            return text
        if _OTHER_URL.match(text) and not text.startswith("file://"):
            raise ValueError(
                f"GCSCheckpointIO saves to gs://bucket/name URLs and local paths, not {text!r}; "
                "use Lightning's TorchCheckpointIO (with an fsspec filesystem) for other storage"
            )
        return None
