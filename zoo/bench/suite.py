"""Run benchmark rows: the peer (if asked) and then zoo on each `BenchSpec`, into report rows.

`plan` turns the options of a `zoo bench` run (flavors, presets, a `Workload`: shapes, precision,
timing) into `BenchSpec` rows, filling in the device's defaults; `run_spec` measures one row.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, Unpack

import jax

from zoo import presets
from zoo.bench.floor import covers as floor_covers
from zoo.bench.hardware import (
    PEER_PACKAGES,
    ZOO_PACKAGES,
    device_info,
    measured_peak_bf16,
    peak_bf16,
    peak_memory,
    versions,
    xla_settings,
)
from zoo.bench.report import add_ratios, new_row, now_utc, write_results
from zoo.bench.run_zoo import ZooRun
from zoo.bench.timing import interleave
from zoo.bench.workload import (
    ATTENTION_CHOICES,
    FLAVORS,
    MOE_PATHS,
    PRECISIONS,
    BenchSpec,
    defaults_for,
)
from zoo.host import allocator_note
from zoo.nn.stack import scans
from zoo.version import __version__

PEERS = ("torch", "floor")


def attention_for(choice: str, platform: str, precision: str) -> str | None:
    """The attention implementation for `--attention`: "auto" is cuDNN for bf16 on a GPU.

    cuDNN's fused attention takes only half-precision inputs; elsewhere None lets JAX choose.
    """
    if choice == "auto":
        return "cudnn" if platform == "gpu" and precision == "bf16" else None
    return choice


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What every row of a `zoo bench` run measures; None takes the device's default
    (`zoo.bench.workload.defaults_for`), capped at each preset's `max_positions`."""

    batch: int | None = None  # sequences (pairs, for a translator) per step
    seq: int | None = None  # positions per sequence
    precision: str | None = None  # fp32 | bf16: the compute dtype
    attention: str = "auto"  # auto | xla | cudnn (auto: cuDNN for bf16 on a GPU, else XLA's)
    decode_prompt: int | None = None  # prompt length of the GPT decode measurement
    decode_tokens: int | None = None  # tokens generated per sequence; 0 skips decoding
    steps: int | None = None  # timed calls per measurement (their median is reported)
    warmup: int | None = None  # untimed calls after the compiling one

    def __post_init__(self) -> None:
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ValueError(
                f"precision must be one of {PRECISIONS}, got {self.precision!r} "
                "(or None: the device's default)"
            )
        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(
                f"attention must be one of {ATTENTION_CHOICES}, got {self.attention!r} "
                "(auto: cuDNN for bf16 on a GPU, else XLA's)"
            )
        for name, least in WORKLOAD_MINIMUMS.items():
            value = getattr(self, name)
            if value is not None and value < least:
                flag = "--" + name.replace("_", "-")
                raise ValueError(
                    f"{name} must be >= {least}, got {value}; pass a larger {flag} or leave it "
                    "out for the device's default"
                )


# The smallest value of each count of a `Workload` (None aside).
WORKLOAD_MINIMUMS = {
    "batch": 1, "seq": 1, "decode_prompt": 1, "decode_tokens": 0, "steps": 1, "warmup": 0,
}  # fmt: skip


class SpecOptions(TypedDict, total=False):
    """The fields of every `BenchSpec` of a run that `plan` passes on as they are."""

    pad_vocab: bool
    layers: str | None
    remat: str | None
    dropout: float
    seed: int
    rounds: int
    mesh: str | None
    num_layers: int | None


def plan(
    platform: str,
    *,
    flavors: list[str] | None = None,
    preset_names: list[str] | None = None,
    workload: Workload | None = None,
    moe_paths: list[str] | None = None,
    **options: Unpack[SpecOptions],
) -> list[BenchSpec]:
    """The rows of a `zoo bench` run; what is not given comes from the device's defaults.

    Presets pick the rows when given (and must belong to `flavors`, if those are given too);
    otherwise each flavor (all by default) runs its default preset for the device.
    `workload` gives the shapes, precision and timing of every row (`Workload`). `moe_paths`
    (`--moe-path ragged,dense`) gives each mixture-of-experts preset one row per path, in that
    order (each row times the peer again, in turns with that path). `options` go to
    `BenchSpec` as they are (`SpecOptions`: pad_vocab, layers, remat, dropout, seed, rounds,
    mesh, num_layers).
    """
    unknown = sorted(set(options) - SpecOptions.__optional_keys__)
    if unknown:  # a field of `workload`, or a misspelling: refused as Python would
        raise TypeError(f"plan() got an unexpected keyword argument {unknown[0]!r}")
    shape = workload or Workload()
    defaults = defaults_for(platform)
    for flavor in flavors or []:
        if flavor not in FLAVORS:
            raise ValueError(f"unknown flavor {flavor!r}; choose from {FLAVORS}")
    if preset_names:
        names = list(preset_names)
        for name in names:
            if flavors and presets.get(name).flavor not in flavors:
                raise ValueError(
                    f"preset {name!r} is a {presets.get(name).flavor}, not a "
                    f"{' or '.join(flavors)}; drop --flavor or pick a matching preset"
                )
    else:
        names = [defaults.presets[flavor] for flavor in (flavors or FLAVORS)]
    precision = shape.precision or defaults.precision
    for path in moe_paths or []:
        if path not in MOE_PATHS:
            raise ValueError(f"unknown --moe-path {path!r}; choose from {MOE_PATHS}")
    specs = []
    for name in names:
        preset = presets.get(name)
        has_experts = preset.config.experts() is not None
        paths: list[str | None] = list(moe_paths) if moe_paths and has_experts else [None]
        max_positions = preset.config.max_positions
        prompt = shape.decode_prompt or min(defaults.decode_prompt, max_positions // 2)
        new_tokens = defaults.decode_tokens if shape.decode_tokens is None else shape.decode_tokens
        if shape.decode_tokens is None:
            new_tokens = min(new_tokens, max_positions - prompt)
        specs += [
            BenchSpec(
                preset=name,
                batch=shape.batch or defaults.batch[preset.flavor],
                seq=shape.seq or min(defaults.seq[preset.flavor], max_positions),
                precision=precision,
                attention=attention_for(shape.attention, platform, precision),
                decode_prompt=prompt,
                decode_tokens=new_tokens,
                steps=shape.steps or defaults.steps,
                warmup=defaults.warmup if shape.warmup is None else shape.warmup,
                moe_path=path,
                **options,
            )
            for path in paths
        ]
    if moe_paths and not any(spec.moe_path for spec in specs):
        raise ValueError(
            "--moe-path chooses how a mixture of experts runs, and no preset of this run has "
            "experts; drop --moe-path or add an MoE preset (mixtral-*, qwen3-moe-*, olmoe-*, ...)"
        )
    return specs


def run_spec(
    spec: BenchSpec,
    *,
    peer: str | Sequence[str] | None = None,
    peer_compile: bool = False,
    date: str | None = None,
    first: bool = True,
    sequential: bool = False,
    profile: Path | None = None,
    profile_steps: int = 3,
) -> dict[str, Any]:
    """Measure one row: start (compile, warm up) the peer and zoo, then time them in turns.

    The timed calls of every measurement (train, forward, decode; zoo and peer) are spread over
    `spec.rounds` rounds, so a change in the machine's load hits both sides alike.

    Args:
        spec: the row: preset, shapes, precision and how to time it.
        peer: `torch` to time HuggingFace transformers on the same work too, `floor` the plain-JAX
            floor (`zoo.bench.floor`), or both (a sequence); None: zoo alone.
        peer_compile: also time the peer under `torch.compile` (the faster mode is compared).
        date: the row's date (UTC, ISO 8601); None: now.
        first: whether this is the first row of the process (a later row's peak memory may be
            an earlier row's, and says so).
        sequential: time the peer alone and release its memory before zoo starts (for
            accelerators that cannot hold both); False: the two in turns.
        profile: a folder to trace `profile_steps` more train steps of zoo into, summarised
            there (`zoo.bench.profile`); None: no trace.
        profile_steps: the train steps `profile` traces.
    """
    device = device_info()
    config = spec.config()
    experts = config.experts()
    row = new_row(
        flavor=spec.flavor,
        preset=spec.preset,
        batch=spec.batch,
        seq=spec.seq,
        tokens_per_step=spec.tokens_per_step(),
        precision=spec.precision,
        layers="scan" if scans(config.scan_layers) else "unroll",
        num_layers=config.num_layers,
        moe_path=None if experts is None else experts.implementation,
        remat=config.remat or "none",
        attention=config.layers.block.attention.implementation,
        vocab_size=config.vocab_size,
        dropout=spec.dropout,
        mesh=spec.mesh,
        steps=spec.steps,
        warmup=spec.warmup,
        rounds=spec.rounds,
        device=device["device"],
        date=date or now_utc(),
    )
    before, _ = peak_memory()
    peaks = (
        peak_bf16(device["device_kind"], device["platform"]),
        measured_peak_bf16(device["device_kind"], device["platform"]),
    )
    peers = (peer,) if isinstance(peer, str) else tuple(peer or ())
    for name in peers:
        if name not in PEERS:
            raise ValueError(f"unknown peer {name!r}; choose from {PEERS}")
    runs: list[Any] = []  # timed in turns: the torch peer, the floor, zoo
    torch_device = None
    if "torch" in peers:
        from zoo.bench import peer_torch

        torch_device = peer_torch.torch_device(device["platform"])
        runs.append(peer_torch.PeerRun(spec, torch_device, compile=peer_compile))
        if sequential:  # the peer alone, its memory freed before the JAX runs start
            row.update(_timed(runs, spec)[0])
            runs.clear()
            peer_torch.release_memory(torch_device)
    else:
        row["peer_reason"] = "no peer requested (--peer torch)"
    if "floor" in peers:
        reason = floor_reason(spec)
        if reason is None:
            from zoo.bench.peer_floor import FloorRun

            runs.append(FloorRun(spec))
        else:
            row["floor_reason"] = reason
    zoo_run = ZooRun(spec, *peaks)
    runs.append(zoo_run)
    for fields in _timed(runs, spec):
        row.update(fields)
    runs.clear()
    if torch_device is not None:
        peer_torch.release_memory(torch_device)
    if profile is not None:
        from zoo.bench.profile import format_summary, profile_run

        try:
            summary = profile_run(zoo_run, profile, steps=profile_steps)
        except Exception as error:  # the row's timings stand without the profile
            row["profile_reason"] = f"profiling failed: {type(error).__name__}: {error}"
            print(f"zoo bench: {row['profile_reason']}", file=sys.stderr)
        else:
            print(
                format_summary(summary, f"{spec.preset} {spec.batch}x{spec.seq} {spec.precision}"),
                file=sys.stderr,
            )
            row["profile"] = str(Path(profile) / summary["files"]["summary"])
            row["profile_categories"] = {
                name: round(slot["share"], 4) for name, slot in summary["categories"].items()
            }
    else:
        row["profile_reason"] = "not asked for (--profile DIR)"
    if not first and before is not None and row["peak_memory_bytes"] == before:
        row["peak_memory_reason"] = (
            "upper bound: an earlier row in this process set the peak; "
            "bench one preset per process for its own peak"
        )
    return finite(add_ratios(row))


def floor_reason(spec: BenchSpec) -> str | None:
    """None when the floor can run this row, else why it does not."""
    if spec.mesh is not None:
        return "the floor runs on one device (drop --mesh)"
    if spec.dropout:
        return "the floor has no dropout (--dropout 0)"
    return floor_covers(spec.flavor, spec.config())


def _timed(runs: list[Any], spec: BenchSpec) -> list[dict[str, Any]]:
    """Start every run, time all their calls in interleaved rounds, return each run's fields."""
    # bf16 attention promotes internally, which JAX's strict promotion mode refuses.
    with jax.numpy_dtype_promotion("standard"):
        for run in runs:
            try:
                run.start()
            except Exception as error:
                if spec.attention != "cudnn":
                    raise
                raise RuntimeError(
                    f"{spec.preset} failed with cuDNN attention ({type(error).__name__}: {error}); "
                    "rerun with --attention xla"
                ) from error
        timers = [timer for run in runs for timer in run.timers.values()]
        interleave(timers, steps=spec.steps, rounds=spec.rounds)
    return [run.fields() for run in runs]


def finite(row: dict[str, Any]) -> dict[str, Any]:
    """NaN and infinities become null, so the row is valid JSON."""
    return {
        name: None if isinstance(value, float) and not math.isfinite(value) else value
        for name, value in row.items()
    }


def git_state(directory: Path | None = None) -> tuple[str | None, bool | None]:
    """(checked-out commit, whether tracked files differ from it) of the zoo sources, if they
    are a git checkout; (None, None) otherwise."""
    directory = directory or Path(__file__).resolve().parent

    def git(*words: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *words], cwd=directory, capture_output=True, text=True, timeout=5
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None, None
    changes = git("status", "--porcelain", "--untracked-files=no")
    return commit, None if changes is None else bool(changes)


def run_meta(command: str, date: str, *, peer: str | None) -> dict[str, Any]:
    """What a results file says about its run: when, how, where, with which versions."""
    device = device_info()
    peak = peak_bf16(device["device_kind"], device["platform"])
    packages = ZOO_PACKAGES + (PEER_PACKAGES if peer else ())
    commit, dirty = git_state()
    return {
        "date": date,
        "command": command,
        "device": device,
        "peak_bf16_tflops": peak.tflops,
        "peak_name": peak.name,
        "peak_measured": measured_peak_bf16(device["device_kind"], device["platform"]).label,
        "xla_settings": xla_settings(),
        "versions": {"zoo": __version__, **versions(*packages)},
        "git_commit": commit,
        "git_dirty": dirty,
        # other work on the machine skews timings; the 1/5/15-minute load says how much
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        # both zoo and the peer run in this process, under the same allocator setting
        "host_allocator": allocator_note(),
        "python_executable": sys.executable,
    }


def write_script_results(
    name: str, rows: list[dict[str, Any]], date: str, argv: list[str], directory: Path
) -> Path:
    """Results of `benchmarks/<name>.py` (run with `argv`) as `<name>-<date>-<device>.json`."""
    command = " ".join([f"python benchmarks/{name}.py", *argv])
    return write_results(directory, rows, run_meta(command, date, peer=None), name=name)
