"""`--mesh data=2,fsdp=2,tensor=2` (`zoo train`, `zoo eval`, `zoo bench`) and the options that
join many processes (`zoo train`, `zoo eval`).

`--coordinator HOST:PORT --num-processes N --process-id I` (or the variables
`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`), or `--distributed auto` on a
cluster JAX recognises (SLURM, Open MPI, TPU pods), join one run of many processes. The command
line calls `join_processes` before anything starts JAX's backend, then `quiet_other_processes`:
process 0 reports for all of them.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zoo.distributed.layout import Layout

MESH_HELP = (
    "train or run on many devices: axis sizes data=N,fsdp=N,tensor=N multiplying to the "
    "device count, over every process (-1 takes the rest); see docs/distributed.md. "
    "Default: one device"
)


def add_mesh_option(parser: argparse._ActionsContainer, *, processes: bool = False) -> None:
    """`--mesh` on `parser` (a parser or one of its groups), and with `processes` the options
    that join many processes."""
    parser.add_argument("--mesh", metavar="AXES", help=MESH_HELP)
    if not processes:
        return
    hosts = parser.add_argument_group(
        "many processes (hosts)",
        "run the same command in every process; process 0 writes the files. Without these, "
        "JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID are read if set",
    )
    hosts.add_argument(
        "--coordinator", metavar="HOST:PORT", help="process 0's address and a free port"
    )
    hosts.add_argument("--num-processes", type=int, metavar="N", help="how many processes")
    hosts.add_argument("--process-id", type=int, metavar="I", help="this process: 0 to N-1")
    hosts.add_argument(
        "--distributed",
        choices=("auto",),
        help="auto: join the processes of a SLURM, Open MPI or TPU-pod job (JAX finds them)",
    )


def join_processes(args: argparse.Namespace) -> bool:
    """`zoo.distributed.initialize` with the options above; whether many processes were joined."""
    if not hasattr(args, "process_id"):  # a command without these options
        return False
    from zoo.distributed.hosts import AUTO, initialize

    if args.distributed == AUTO and args.coordinator is not None:
        raise ValueError(
            "--distributed auto finds the coordinator itself; leave out --coordinator (or "
            "--distributed auto to name it yourself)"
        )
    coordinator = AUTO if args.distributed == AUTO else args.coordinator
    return initialize(coordinator, args.num_processes, args.process_id)


def quiet_other_processes() -> None:
    """On processes other than 0: no warnings from zoo's loggers and no progress bars or logs
    from `datasets` (process 0 shows them once for the run); errors still reach the terminal."""
    import logging

    import jax

    if jax.process_index() == 0:
        return
    logging.getLogger("zoo").setLevel(logging.ERROR)
    try:
        import datasets
    except ImportError:  # a command that reads no datasets
        return
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


def layout_from_args(args: argparse.Namespace) -> Layout | None:
    """The `zoo.distributed.Layout` of `--mesh` (None without it)."""
    if not getattr(args, "mesh", None):
        return None
    from zoo.distributed.layout import Layout

    return Layout.of(args.mesh)
