"""Benchmarks: training, inference and decoding throughput, MFU, compile time, a PyTorch peer.

`zoo bench` on the command line; in Python:

```python
from zoo.bench import BenchSpec, run_spec
row = run_spec(BenchSpec(preset="gpt-tiny", batch=16, seq=64), peer="torch")
```

| module | what |
| --- | --- |
| `workload` | `BenchSpec` (preset, shapes, precision), device defaults, the random batch |
| `run_zoo` | the trainer's jitted step, a jitted vmapped forward, a greedy KV-cache decode |
| `peer_models` | HuggingFace transformers models mirroring zoo configs, their AdamW and loss |
| `peer_torch` | the same work timed on the peer (optional `bench` extra) |
| `flops` | model FLOPs per token (6N + 12 L H Q T) and the encoder-decoder count |
| `hardware` | device name, dense bf16 peak table, MFU, peak memory, versions |
| `timing` | warm-up, `block_until_ready`, interleaved rounds, median; compile time |
| `report` | row fields, the table, the results JSON |
| `suite` | rows from options (`plan` with a `Workload`); per row, zoo and peer timed in turns |
"""

from zoo.bench.flops import FlopCount, decoder_flops_per_token, train_flops
from zoo.bench.hardware import Peak, mfu, peak_bf16
from zoo.bench.report import FIELDS
from zoo.bench.suite import Workload, plan, run_spec
from zoo.bench.workload import BenchSpec

__all__ = [
    "FIELDS",
    "BenchSpec",
    "FlopCount",
    "Peak",
    "Workload",
    "decoder_flops_per_token",
    "mfu",
    "peak_bf16",
    "plan",
    "run_spec",
    "train_flops",
]
