"""Many processes (hosts): joining the run, which process writes, gathering arrays for export.

One process per host (or per GPU) runs the same program; `jax.distributed.initialize` connects
them so that `jax.devices()` lists every device of every process and one mesh spans them all.

```python
zoo.distributed.initialize()                     # JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
                                                 # JAX_PROCESS_ID; none set: one process
zoo.distributed.initialize("10.0.0.1:1234", num_processes=2, process_id=0)   # explicit
zoo.distributed.initialize("auto")               # SLURM, Open MPI, TPU pods: JAX detects it
```

It must come before anything starts JAX's backend (a computation, `jax.devices()`). Every
process computes; process 0 alone writes the files a run shares (`is_writer`). Arrays split
over devices of other processes are gathered with `gather` (every process must call it).
"""

from __future__ import annotations

import os
from typing import TypedDict

import jax
import numpy as np
from jaxtyping import PyTree

AUTO = "auto"
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
_HOW = (
    "give all three: --coordinator HOST:PORT --num-processes N --process-id I (or the "
    f"variables {ENV_COORDINATOR}, {ENV_NUM_PROCESSES}, {ENV_PROCESS_ID}), or --distributed auto "
    "on a SLURM, Open MPI or TPU-pod cluster"
)


def _env_int(name: str) -> int | None:
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a whole number; set it to e.g. 0") from None


class InitializeArguments(TypedDict, total=False):
    """The keyword arguments `jax.distributed.initialize` is called with."""

    coordinator_address: str  # process 0's HOST:PORT
    num_processes: int
    process_id: int  # this process, 0 to num_processes - 1


def resolve_request(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> InitializeArguments | None:
    """The arguments for `jax.distributed.initialize` (`{}` for "auto"), or None: one process.

    Arguments win over the environment variables; a partial request raises ValueError."""
    if coordinator_address is None:
        coordinator_address = os.environ.get(ENV_COORDINATOR, "").strip() or None
    if num_processes is None:
        num_processes = _env_int(ENV_NUM_PROCESSES)
    if process_id is None:
        process_id = _env_int(ENV_PROCESS_ID)
    if coordinator_address is None and num_processes is None and process_id is None:
        return None
    for name, value in (("num_processes", num_processes), ("process_id", process_id)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"the number of processes must be at least 1, got {num_processes}")
    if process_id is not None and process_id < 0:
        raise ValueError(f"process id {process_id} is negative: number the processes from 0")
    if num_processes is not None and process_id is not None and process_id >= num_processes:
        raise ValueError(
            f"process id {process_id} is out of range for {num_processes} processes: "
            f"number the processes 0 to {num_processes - 1}"
        )
    if coordinator_address == AUTO:
        # JAX fills what is left out from the cluster (SLURM, Open MPI, TPU metadata)
        given: InitializeArguments = {}
        if num_processes is not None:
            given["num_processes"] = num_processes
        if process_id is not None:
            given["process_id"] = process_id
        return given
    missing = [
        name
        for name, value in (
            ("a coordinator address", coordinator_address),
            ("the number of processes", num_processes),
            ("this process's id", process_id),
        )
        if value is None
    ]
    if missing or coordinator_address is None or num_processes is None or process_id is None:
        raise ValueError(f"a run on many processes needs {' and '.join(missing)}: {_HOW}")
    host, separator, port = coordinator_address.rpartition(":")
    if not separator or not host or not port.isdigit():
        raise ValueError(
            f"coordinator address {coordinator_address!r} is not HOST:PORT; give process 0's "
            "host and a free port that every process can reach, e.g. 10.0.0.1:1234"
        )
    return {
        "coordinator_address": coordinator_address,
        "num_processes": num_processes,
        "process_id": process_id,
    }


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> bool:
    """Join a run of many processes when one is asked for; returns whether one was joined.

    Asked for by the arguments, by `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES` and
    `JAX_PROCESS_ID`, or by `coordinator_address="auto"` (the cluster JAX detects: SLURM, Open
    MPI, TPU pods). Nothing asked: nothing happens (one process). Call it first, before any
    JAX computation or `jax.devices()`."""
    request = resolve_request(coordinator_address, num_processes, process_id)
    if request is None:
        return False
    if jax.distributed.is_initialized():
        raise RuntimeError(
            "this process already joined a run of many processes (jax.distributed is "
            "initialized); call zoo.distributed.initialize once"
        )
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        raise RuntimeError(
            "zoo.distributed.initialize() came after JAX had started (a computation or "
            "jax.devices() ran before it); call it first thing, right after the imports, so "
            "that JAX sees the devices of every process"
        )
    try:
        jax.distributed.initialize(**request)
    except ValueError as error:
        if request.get("coordinator_address") is None:  # "auto": no cluster found
            raise ValueError(
                f"--distributed auto found no cluster to join ({error}): it reads SLURM, Open "
                f"MPI and TPU-pod settings; elsewhere {_HOW.split(', or')[0]}"
            ) from None
        raise
    return True


def process_count() -> int:
    """How many processes the run has (1 without `initialize`)."""
    return jax.process_count()


def is_writer() -> bool:
    """Whether this process writes the run's shared files (process 0 does, the others not)."""
    return jax.process_index() == 0


def process_label() -> str:
    """`""` on one process, else `"[process 1/2] "`: a prefix for what other processes print."""
    count = jax.process_count()
    return "" if count == 1 else f"[process {jax.process_index()}/{count}] "


def all_processes_agree(value: bool) -> bool:
    """True on every process when `value` is true on every process (one small collective)."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    votes = multihost_utils.process_allgather(np.asarray(value, np.int32))
    return bool(np.all(votes))


def gather(tree: PyTree) -> PyTree:
    """`tree` (a pytree of arrays, e.g. `eqx.filter(model, eqx.is_array)`) with every array
    whole in this process's memory, as numpy arrays.

    Arrays split over devices of other processes are first copied whole onto every device by
    one jitted program (one compile, not one per array); every process must call this with
    the same tree."""
    leaves = jax.tree_util.tree_leaves(tree)
    spread = [a for a in leaves if isinstance(a, jax.Array) and not a.is_fully_addressable]
    if spread:
        mesh = spread[0].sharding.mesh  # type: ignore[attr-defined]
        whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        tree = jax.jit(_identity, out_shardings=whole)(tree)
    return jax.device_get(tree)


def _identity(tree: PyTree) -> PyTree:
    return tree
