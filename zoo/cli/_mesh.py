"""`--mesh data=2,fsdp=2,tensor=2`: the option `zoo train`, `zoo eval` and `zoo bench` share."""

from __future__ import annotations

import argparse
from typing import Any

MESH_HELP = (
    "train or run on many devices: axis sizes data=N,fsdp=N,tensor=N multiplying to the "
    "device count (-1 takes the rest); see docs/distributed.md. Default: one device"
)


def add_mesh_option(parser: Any) -> None:
    parser.add_argument("--mesh", metavar="AXES", help=MESH_HELP)


def layout_from_args(args: argparse.Namespace) -> Any:
    """The `zoo.distributed.Layout` of `--mesh` (None without it)."""
    if not getattr(args, "mesh", None):
        return None
    from zoo.distributed import Layout

    return Layout.of(args.mesh)
