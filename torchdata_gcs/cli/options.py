"""The settings every subcommand takes from the command line: where requests go, as whom, billed to whom."""

from __future__ import annotations

import argparse

from ..config import ClientConfig

__all__ = ["client_config"]


def client_config(args: argparse.Namespace) -> ClientConfig:
    """``--endpoint``, ``--anonymous`` and ``--user-project`` as a ``ClientConfig``."""
    return ClientConfig(
        endpoint=args.endpoint, anonymous=True if args.anonymous else None, user_project=args.user_project
    )
