"""The Python half of `benchmarks/gpu.sh`: what the machine is, and the closing table.

    python benchmarks/gpu_suite.py env RESULTS_DIR       # devices and versions -> environment.json
    python benchmarks/gpu_suite.py summary RESULTS_DIR   # steps, bench rows, targets -> summary.json

`summary` reads every `bench-*.json` under RESULTS_DIR (one `zoo bench` call per row) and
nanoGPT's timing from its log, prints the steps `gpu.sh` ran (`steps.tsv`), the rows as
`zoo bench` prints them, and the GPU targets (docs/benchmarks.md) with the measured value, the
goal and whether it is met.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
from pathlib import Path
from typing import Any

# Packages whose versions decide the numbers: printed first, and recorded.
PACKAGES = (
    "jax",
    "jaxlib",
    "jax-cuda13-plugin",
    "jax-cuda13-pjrt",
    "jax-cuda12-plugin",
    "jax-cuda12-pjrt",
    "equinox",
    "optax",
    "jaxtyping",
    "numpy",
    "torch",
    "transformers",
    "pytest",
    "beartype",
    "datasets",
    "pyarrow",
)

# HBM bandwidth in TB/s from the datasheets, by the name of the bf16 peak table
# (zoo.bench.hardware.PEAK_BF16_TFLOPS): the floor of batch-1 decoding is weight bytes over it.
HBM_TBPS = {"H100 SXM": 3.35, "H100 PCIe": 2.0, "H100 NVL": 3.9, "H200": 4.8, "GH200": 4.0}

# The GPU targets of docs/benchmarks.md, one per row of the closing table.
GPT2_TOKENS_PER_S = 490_000  # gpt2 16 x 1024 bf16 training on one H100 (about 40% MFU)
NANOGPT_RATIO = 1.1  # gpt2 16 x 1024 training over nanoGPT's bench.py in the same call
PEER_RATIO = 1.2  # training tokens/s over the PyTorch peer's faster mode
# preset, batch, seq, goal of zoo's training tokens/s over the HF peer's faster mode
PEER_TARGETS = (
    ("bert-base", 32, 512, PEER_RATIO),
    ("smollm2-135m", 16, 1024, PEER_RATIO),
    ("transformer-base", 32, 128, 2.0),
)
# the mixture of experts row: OLMoE-1B-7B's widths in 2 layers, zoo's ragged path over the peer
MOE_ROW = ("olmoe-1b-7b", 8, 1024)
DECODE_FLOOR_FACTOR = 3.0  # batch-1 decoding within 3x of the weight-bandwidth floor
FLOOR_RATIO = 0.95  # zoo over the plain-JAX floor (`--peer floor`), every row that has one
COMPILE_S = 60.0  # gpt2 train step: trace + lower + XLA compile
PEER_PARAMS_RTOL = 0.1  # a peer further than this from zoo's parameter count is another model


def environment() -> dict[str, Any]:
    """Devices, versions and settings of this machine, as `gpu.sh` prints them first."""
    import jax

    from zoo.bench.hardware import (
        device_info,
        measured_peak_bf16,
        peak_bf16,
        versions,
        xla_settings,
    )

    info = device_info()
    devices = []
    for device in jax.devices():
        stats = device.memory_stats() or {}
        devices.append(
            {
                "id": device.id,
                "platform": device.platform,
                "device_kind": device.device_kind,
                "memory_bytes": stats.get("bytes_limit"),
            }
        )
    found: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.platform(),
        "jax_backend": jax.default_backend(),
        "devices": devices,
        "device": info,
        "peak_datasheet": peak_bf16(info["device_kind"], info["platform"]).label,
        "peak_measured": measured_peak_bf16(info["device_kind"], info["platform"]).label,
        "versions": versions(*PACKAGES),
        "xla_settings": xla_settings(),
        "torch": _torch_facts(),
    }
    return found


def describe(found: dict[str, Any]) -> list[str]:
    """A few lines of `environment()` for the console (the JSON file has everything)."""
    known = {name: version for name, version in found["versions"].items() if version}
    lines = [f"python {found['python']} on {found['machine']}"]
    lines += [f"device {d['id']}: {d['device_kind']} ({d['platform']})" for d in found["devices"]]
    lines.append("versions: " + ", ".join(f"{name} {version}" for name, version in known.items()))
    missing = [name for name, version in found["versions"].items() if not version]
    lines.append("not installed: " + (", ".join(missing) or "-"))
    lines.append(f"torch: {found['torch']}")
    lines.append(f"peak: {found['peak_datasheet']}; measured: {found['peak_measured']}")
    settings = {name: value for name, value in found["xla_settings"].items() if value}
    lines.append(f"XLA and JAX settings: {settings}")
    return lines


def _torch_facts() -> dict[str, Any]:
    try:
        import torch
    except ImportError as error:
        return {"missing": str(error)}
    cuda = torch.cuda.is_available()
    return {
        "cuda_available": cuda,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "device": torch.cuda.get_device_name(0) if cuda else None,
    }


def read_rows(results: Path) -> list[dict[str, Any]]:
    """Every row of every `bench-*.json` under `results`, in file order."""
    rows = []
    for path in sorted(results.glob("bench-*.json")):
        rows += json.loads(path.read_text())["rows"]
    return rows


def read_steps(results: Path) -> list[dict[str, str]]:
    """The steps `gpu.sh` recorded: name, status, seconds, note."""
    path = results / "steps.tsv"
    if not path.is_file():
        return []
    steps = []
    for line in path.read_text().splitlines():
        name, status, seconds, note = ([*line.split("\t"), "", "", ""])[:4]
        steps.append({"step": name, "status": status, "seconds": seconds, "note": note})
    return steps


def _find(
    rows,
    preset: str,
    *,
    batch: int | None = None,
    seq: int | None = None,
    moe_path: str | None = None,
):
    for row in rows:
        shape = batch in (None, row["batch"]) and seq in (None, row["seq"])
        path = moe_path is None or row.get("moe_path") == moe_path
        if row["preset"] == preset and shape and path:
            return row
    return None


def _target(name: str, value: float | None, goal: str, met: bool | None, note: str = ""):
    return {"target": name, "value": value, "goal": goal, "met": met, "note": note}


NANOGPT_TIME = re.compile(r"time per iteration: ([0-9.]+) ?ms")


def read_nanogpt(results: Path) -> dict[tuple[int, int], float]:
    """nanoGPT's training tokens/s by (batch, seq), from the logs of gpu.sh's nanogpt rows."""
    found = {}
    for log in sorted((results / "logs").glob("nanogpt-*x*.log")):
        shape = re.fullmatch(r"nanogpt-(\d+)x(\d+)\.log", log.name)
        times = NANOGPT_TIME.findall(log.read_text(errors="replace"))
        if shape and times:
            batch, seq = int(shape.group(1)), int(shape.group(2))
            found[batch, seq] = batch * seq / (float(times[-1]) / 1000)
    return found


def targets(
    rows: list[dict[str, Any]], nanogpt: dict[tuple[int, int], float] | None = None
) -> list[dict[str, Any]]:
    """Each GPU target with the measured value (None: the row is missing or not measured).
    `nanogpt` holds nanoGPT's tokens/s by (batch, seq), measured in the same call."""
    found = []
    gpt2 = _find(rows, "gpt2", batch=16, seq=1024)
    tokens = gpt2 and gpt2["tokens_per_s"]
    found.append(
        _target(
            "gpt2 16x1024 train tokens/s",
            tokens,
            f">= {GPT2_TOKENS_PER_S:,}",
            None if tokens is None else tokens >= GPT2_TOKENS_PER_S,
            "" if gpt2 is None else f"MFU {gpt2['mfu']} ({gpt2['mfu_peak']})",
        )
    )
    reference = (nanogpt or {}).get((16, 1024))
    ratio = None if tokens is None or reference is None else tokens / reference
    found.append(
        _target(
            "gpt2 16x1024 train / nanoGPT",
            ratio,
            f">= {NANOGPT_RATIO}x",
            None if ratio is None else ratio >= NANOGPT_RATIO,
            "no nanoGPT row" if reference is None else f"nanoGPT {reference:,.0f} tok/s",
        )
    )
    for preset, batch, seq, goal in PEER_TARGETS:
        found.append(_ratio_target(_find(rows, preset, batch=batch, seq=seq), preset, goal))
    found.append(_moe_target(rows))
    found.append(_decode_target(_find(rows, "gpt2", batch=1)))
    found += _floor_targets(rows)
    compile_s = gpt2 and gpt2["compile_s"]
    found.append(
        _target(
            "gpt2 train step compile s",
            compile_s,
            f"< {COMPILE_S:g}",
            None if compile_s is None else compile_s < COMPILE_S,
        )
    )
    return found


def _floor_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """zoo over the plain-JAX floor, for each row and measurement the floor ran."""
    found = []
    for row in rows:
        for kind, field in (("train", "floor_ratio"), ("decode", "floor_decode_ratio")):
            ratio = row.get(field)
            if ratio is None:
                continue
            name = f"{row['preset']} {row['batch']}x{row['seq']} {kind} / floor"
            target = _target(name, ratio, f">= {FLOOR_RATIO}x", ratio >= FLOOR_RATIO)
            found.append(target)
    return found


def _ratio_target(
    row: dict[str, Any] | None, preset: str, goal: float = PEER_RATIO
) -> dict[str, Any]:
    ratio = row and row["ratio"]
    note = ""
    if row is not None and not same_size(row):
        # a peer of another size is not the same work: the ratio does not count
        note = f"peer has {row['peer_params']:,} parameters, zoo {row['params']:,}"
        ratio = None
    elif row is not None:
        note = f"peer {row['peer_mode']}"
    met = None if ratio is None else ratio >= goal
    return _target(f"{preset} train / peer", ratio, f">= {goal}x", met, note)


def _moe_target(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """zoo's ragged mixture of experts over the peer; the note compares it with zoo's dense
    reference path and gives both paths' compiled temporaries."""
    preset, batch, seq = MOE_ROW
    ragged = _find(rows, preset, batch=batch, seq=seq, moe_path="ragged")
    dense = _find(rows, preset, batch=batch, seq=seq, moe_path="dense")
    found = _ratio_target(ragged, "olmoe 2-layer ragged")
    if ragged is not None and dense is not None and dense["tokens_per_s"]:
        speedup = ragged["tokens_per_s"] / dense["tokens_per_s"]
        temp = "/".join(_gib(row.get("train_temp_bytes")) for row in (ragged, dense))
        found["note"] += f"; {speedup:.2f}x the dense path; temporaries {temp} GiB"
    return found


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}"


def _decode_target(row: dict[str, Any] | None) -> dict[str, Any]:
    """Batch-1 decoding against parameter bytes (compute dtype) / HBM bandwidth per token."""
    name = "gpt2 batch-1 decode tokens/s"
    if row is None or not row["decode_tokens_per_s"]:
        return _target(name, None, f">= floor / {DECODE_FLOOR_FACTOR:g}", None, "no batch-1 row")
    from zoo.bench.hardware import peak_bf16

    device = peak_bf16(row["device"], "gpu").name
    bandwidth = HBM_TBPS.get(device or "")
    if bandwidth is None:
        return _target(name, row["decode_tokens_per_s"], "", None, f"no HBM bandwidth for {device}")
    bytes_per_param = 2 if row["precision"] == "bf16" else 4
    floor = bandwidth * 1e12 / (row["params"] * bytes_per_param)  # tokens/s at the floor
    goal = floor / DECODE_FLOOR_FACTOR
    note = f"floor {floor:,.0f} tok/s: {row['params']:,} x {bytes_per_param} B at {bandwidth} TB/s"
    return _target(
        name,
        row["decode_tokens_per_s"],
        f">= {goal:,.0f}",
        row["decode_tokens_per_s"] >= goal,
        note,
    )


def same_size(row: dict[str, Any]) -> bool:
    """Whether the peer's parameter count is within `PEER_PARAMS_RTOL` of zoo's (or unknown).

    The BERT and Marian peers differ by small parts (a pooler, stored sinusoid tables: under 1%
    of the published shapes, up to 5% of the tiny ones); a peer of another architecture (a
    GPT-2 standing in for a Llama) differs by far more.
    """
    if row.get("peer_params") is None:
        return True
    return abs(row["peer_params"] - row["params"]) <= PEER_PARAMS_RTOL * row["params"]


def peer_warnings(rows: list[dict[str, Any]]) -> list[str]:
    """A line per row whose peer is not the same model as zoo's: its ratios mean little."""
    return [
        f"{row['preset']} {row['batch']}x{row['seq']}: the peer ({row['peer_model']}) has "
        f"{row['peer_params']:,} parameters, zoo {row['params']:,}: not the same model"
        for row in rows
        if not same_size(row)
    ]


def read_profiles(results: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(results.glob("profile/*.profile.json"))]


def profile_lines(profiles: list[dict[str, Any]]) -> list[str]:
    """One line per profile: wall and busy time, the three largest kinds of work, the top op."""
    lines = []
    for found in profiles:
        kinds = sorted(found["categories"].items(), key=lambda item: -item[1]["ms"])[:3]
        shares = ", ".join(f"{name} {slot['share']:.0%}" for name, slot in kinds)
        wall = found.get("wall_ms_per_step")
        top = found["top"][0] if found["top"] else None
        lines.append(
            f"{found['preset']} {found['batch']}x{found['seq']}: wall {_cell(wall)}, "
            f"busy {_cell(found['busy_ms_per_step'])}; {shares}"
            + (
                f"; top {top['op']} {_cell(top['ms'])} ({top['category']}, {top['source']})"
                if top
                else ""
            )
        )
    return lines


def finetune_lines(results: Path) -> list[str]:
    """One line per `finetune` row (benchmarks/finetune_peer.py): zoo's and TRL's seconds a
    step and whole command, their ratio, and the peak memory of each."""
    lines = []
    for path in sorted(results.glob("finetune_peer-*.json")):
        found = json.loads(path.read_text())
        meta, zoo, trl = found["meta"], found.get("zoo", {}), found.get("trl", {})
        head = f"{meta['batch']}x{meta['max_len']} {meta['precision']}, {meta['weights']}"
        if "seconds_per_step" not in zoo or "seconds_per_step" not in trl:
            failed = [side for side, got in (("zoo", zoo), ("trl", trl)) if "error" in got]
            lines.append(f"{head}: failed ({', '.join(failed) or 'no result'}; see {path.name})")
            continue
        ratio = trl["seconds_per_step"] / zoo["seconds_per_step"]
        median = ""
        if zoo.get("median_seconds_per_step") and trl.get("median_seconds_per_step"):
            zoo_median, trl_median = zoo["median_seconds_per_step"], trl["median_seconds_per_step"]
            median = (
                f", median zoo {_cell(zoo_median)} TRL {_cell(trl_median)} "
                f"({trl_median / zoo_median:.2f}x)"
            )
        lines.append(
            f"{head}: s/step zoo {_cell(zoo['seconds_per_step'])} TRL "
            f"{_cell(trl['seconds_per_step'])} ({ratio:.2f}x){median}; whole command zoo "
            f"{_cell(zoo['wall_seconds'])} s TRL {_cell(trl['wall_seconds'])} s; device peak MB "
            f"zoo {_cell(zoo.get('device_peak_mb'))} TRL {_cell(trl.get('device_peak_mb'))}"
        )
    return lines


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3g}" if value < 1000 else f"{value:,.0f}"
    return str(value)


def summary(results: Path) -> dict[str, Any]:
    """Print the closing tables; return what they show (written to summary.json)."""
    from zoo.bench.report import notes, table

    steps, rows = read_steps(results), read_rows(results)
    print("steps:")
    for step in steps:
        print(f"  {step['step']:<36} {step['status']:<10} {step['seconds']:>5} s  {step['note']}")
    checks = targets(rows, read_nanogpt(results))
    print("\ntargets:")
    for check in checks:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[check["met"]]
        print(
            f"  {check['target']:<30} {_cell(check['value']):>10}  goal {check['goal']:<12} "
            f"{verdict:<12} {check['note']}"
        )
    profiles = read_profiles(results)
    if profiles:
        print("\nwhere the train step's time goes (zoo bench --profile; ms per step):")
        for line in profile_lines(profiles):
            print(f"  {line}")
    finetunes = finetune_lines(results)
    if finetunes:
        print("\nLoRA fine-tune, zoo against TRL (benchmarks/finetune_peer.py):")
        for line in finetunes:
            print(f"  {line}")
    print(f"\n{len(rows)} bench row(s) from {results}:")
    if rows:
        print(table(rows))
        for line in notes(rows) + peer_warnings(rows):
            print(line)
    return {
        "steps": steps,
        "targets": checks,
        "rows": len(rows),
        "profiles": profile_lines(profiles),
        "finetune": finetunes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("env", "summary"))
    parser.add_argument("results", type=Path, help="the results folder of gpu.sh")
    args = parser.parse_args(argv)
    args.results.mkdir(parents=True, exist_ok=True)
    if args.what == "env":
        found = environment()
        (args.results / "environment.json").write_text(json.dumps(found, indent=2) + "\n")
        for line in describe(found):
            print(line)
    else:
        found = summary(args.results)
        (args.results / "summary.json").write_text(json.dumps(found, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
