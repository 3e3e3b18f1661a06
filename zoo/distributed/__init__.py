"""Many devices: a mesh from a string, partition rules as data, layouts, many processes.

```python
mesh = zoo.distributed.make_mesh("data=2,fsdp=2,tensor=2")   # 8 devices
zoo.distributed.describe(model, mesh)                         # sharding and bytes per device
zoo.distributed.describe(model, zoo.distributed.abstract_mesh("fsdp=64", 64))   # plan ahead
trainer = zoo.Trainer(task, optimizer, mesh=mesh)             # the same step, sharded
zoo.distributed.initialize()       # first thing, on every process of a run on many hosts
```

Models never mention devices: the rules (`RULES`, keyed by pytree paths) say how each array is
split, and the trainer applies them at the `jit` boundary. See docs/distributed.md.
"""

from __future__ import annotations

from zoo.distributed.hosts import gather, initialize, is_writer, process_count
from zoo.distributed.layout import Layout
from zoo.distributed.mesh import (
    AXES,
    BATCH_AXES,
    abstract_mesh,
    as_mesh,
    make_mesh,
    mesh_string,
    parse_mesh,
)
from zoo.distributed.rules import (
    RULES,
    check_tensor,
    describe,
    match_rule,
    partition_spec,
    sharding_table,
    shardings,
)

__all__ = [
    "AXES",
    "BATCH_AXES",
    "RULES",
    "Layout",
    "abstract_mesh",
    "as_mesh",
    "check_tensor",
    "describe",
    "gather",
    "initialize",
    "is_writer",
    "make_mesh",
    "match_rule",
    "mesh_string",
    "parse_mesh",
    "partition_spec",
    "process_count",
    "sharding_table",
    "shardings",
]
