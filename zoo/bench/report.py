"""Benchmark rows: their fields, the table `zoo bench` prints, and the JSON it writes."""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeAlias

from zoo.files import JSONObject, JSONValue

# A row: every field of `FIELDS`, a JSON value each (null where it was not measured).
BenchRow: TypeAlias = JSONObject

# Every field of a row, in order, with what it means. A field that cannot be measured is null,
# with a `*_reason` field saying why.
FIELDS: dict[str, str] = {
    "flavor": "gpt | classifier | translator",
    "preset": "the zoo preset",
    "batch": "sequences (translator: pairs) per step",
    "seq": "positions the model reads per sequence (translator: source and target each)",
    "tokens_per_step": "positions read per step: batch x seq (translator: batch x 2 seq)",
    "precision": "compute dtype: fp32 | bf16 (weights and optimizer state stay float32)",
    "layers": "scan | unroll: how the layer stack runs",
    "num_layers": "transformer blocks of both models (--num-layers: fewer than the preset's)",
    "moe_path": "ragged | dense: how zoo runs the experts (null: no mixture of experts)",
    "remat": "none | dots | full: what the backward pass recomputes (zoo.nn.stack)",
    "attention": "jax.nn.dot_product_attention implementation (null: XLA's default)",
    "vocab_size": "vocabulary of the benchmarked model (padded with --pad-vocab)",
    "dropout": "dropout and attention dropout of both models",
    "mesh": "devices zoo trained on, data=N,fsdp=N,tensor=N (null: one device; see --mesh)",
    "steps": "timed calls per measurement (the median is reported)",
    "warmup": "untimed calls after the first, compiling, call",
    "rounds": "rounds the timed calls are spread over, zoo and peer in turn",
    "params": "all parameters of the zoo model",
    "flop_params": "N of the FLOP count: parameters without position embeddings",
    "flops_per_token": "training FLOPs per token (6N + 12 L H Q T; see zoo.bench.flops)",
    "train_step_s": "median seconds of one train step (forward, backward, AdamW)",
    "train_step_min_s": "fastest timed train step",
    "train_step_max_s": "slowest timed train step",
    "train_step_round_medians_s": "median train step of each round: drift over the run",
    "tokens_per_s": "training tokens per second: tokens_per_step / train_step_s",
    "mfu": "model FLOPs utilisation against the device's datasheet dense bf16 peak",
    "mfu_peak": "the peak mfu divides by (table entry, TFLOP/s, source)",
    "mfu_reason": "why mfu is null",
    "mfu_measured": "model FLOPs utilisation against the measured dense bf16 peak",
    "mfu_measured_peak": "the peak mfu_measured divides by (table entry, TFLOP/s, source)",
    "mfu_measured_reason": "why mfu_measured is null",
    "compile_s": "trace + lower + XLA compile of the train step",
    "xla_compile_s": "the XLA compile alone of the train step (part of compile_s)",
    "first_step_s": "wall time of the first train step, compile included",
    "loss": "training loss after the timed steps (a sanity check: near ln(vocab) at init)",
    "inference_step_s": "median seconds of the jitted, vmapped forward",
    "inference_tokens_per_s": "forward tokens per second",
    "inference_compile_s": "trace + lower + XLA compile of the forward",
    "decode_tokens_per_s": "generated tokens per second, greedy with the KV cache (GPT)",
    "decode_compile_s": "trace + lower + XLA compile of the decode loop",
    "decode_reason": "why decode_tokens_per_s is null",
    "peak_memory_bytes": "peak device memory of the process (device.memory_stats())",
    "peak_memory_reason": "why peak_memory_bytes is null or only an upper bound",
    "train_temp_bytes": "temporaries of the compiled train step (XLA memory_analysis)",
    "train_program_bytes": "compiled train step: arguments + outputs not donated + temporaries",
    "peer": "the peer framework (torch) or null",
    "peer_model": "the transformers class of the peer",
    "peer_attention": "the peer's attention implementation",
    "peer_params": "parameters of the peer model",
    "peer_threads": "torch intra-op threads (torch.get_num_threads())",
    "peer_eager_tokens_per_s": "peer training tokens per second, eager",
    "peer_compiled_tokens_per_s": "peer training tokens per second with torch.compile",
    "peer_compile_s": "first compiled peer step minus a timed one",
    "peer_mode": "eager | compiled: the faster peer, used for the ratios",
    "peer_tokens_per_s": "training tokens per second of the faster peer mode",
    "peer_loss": "the peer's training loss after the timed steps",
    "peer_inference_tokens_per_s": "peer forward tokens per second (faster mode)",
    "peer_decode_tokens_per_s": "peer greedy KV-cache decoding, tokens per second (eager)",
    "peer_peak_memory_bytes": "torch.cuda.max_memory_allocated() (null on CPU)",
    "peer_reason": "why the peer fields (or the compiled ones) are null",
    "ratio": "tokens_per_s / peer_tokens_per_s (> 1: zoo is faster)",
    "inference_ratio": "inference_tokens_per_s / peer_inference_tokens_per_s",
    "decode_ratio": "decode_tokens_per_s / peer_decode_tokens_per_s",
    "floor_tokens_per_s": "training tokens per second of the plain-JAX floor (--peer floor)",
    "floor_train_step_s": "the floor's median train step",
    "floor_compile_s": "the floor's first train step minus a timed one",
    "floor_loss": "the floor's training loss after the timed steps (starts from zoo's weights)",
    "floor_inference_tokens_per_s": "the floor's forward, tokens per second",
    "floor_decode_tokens_per_s": "the floor's greedy KV-cache decoding, tokens per second",
    "floor_reason": "why the floor fields are null (a model or mesh the floor does not have)",
    "floor_ratio": "tokens_per_s / floor_tokens_per_s (1: zoo costs what the plain program does)",
    "floor_inference_ratio": "inference_tokens_per_s / floor_inference_tokens_per_s",
    "floor_decode_ratio": "decode_tokens_per_s / floor_decode_tokens_per_s",
    "profile": "the --profile summary of the train step (file name), null without --profile",
    "profile_categories": "share of the profiled step's op time by kind of work (--profile)",
    "profile_reason": "why profile is null: not asked for, or the trace failed (the timings stand)",
    "xla_settings": "XLA environment variables and JAX settings in force (null: unset)",
    "device": "the device the row ran on",
    "date": "when the run started (UTC, ISO 8601)",
}


def new_row(**values: JSONValue) -> BenchRow:
    """A row with every field (null where not given); unknown fields raise."""
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise KeyError(f"unknown benchmark field(s) {unknown}; known: {list(FIELDS)}")
    return {name: values.get(name) for name in FIELDS}


def add_ratios(row: BenchRow) -> BenchRow:
    """Fill `ratio`, `inference_ratio` and `decode_ratio` (zoo over the PyTorch peer) and their
    `floor_` namesakes (zoo over the plain-JAX floor) where both sides were measured."""
    pairs = {
        "ratio": ("tokens_per_s", "peer_tokens_per_s"),
        "inference_ratio": ("inference_tokens_per_s", "peer_inference_tokens_per_s"),
        "decode_ratio": ("decode_tokens_per_s", "peer_decode_tokens_per_s"),
        "floor_ratio": ("tokens_per_s", "floor_tokens_per_s"),
        "floor_inference_ratio": ("inference_tokens_per_s", "floor_inference_tokens_per_s"),
        "floor_decode_ratio": ("decode_tokens_per_s", "floor_decode_tokens_per_s"),
    }
    for name, (ours, theirs) in pairs.items():
        mine, peers = number(row.get(ours)), number(row.get(theirs))
        if mine and peers:
            row[name] = mine / peers
    return row


def number(value: JSONValue) -> float | None:
    """A measured number of a row (None for a null, or for a field that holds no number)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _count(value: float | None) -> str:
    if value is None:
        return "-"
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def _bytes(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.2f} GiB"


def table(rows: Sequence[Mapping[str, JSONValue]]) -> str:
    """The rows as a fixed-width text table."""
    with_peer = any(row.get("peer") for row in rows)
    columns: list[tuple[str, int, Callable[[Mapping[str, JSONValue]], object]]] = [
        ("flavor", 10, lambda r: r["flavor"]),
        ("preset", 16, lambda r: r["preset"]),
        ("batch x seq", 11, lambda r: f"{r['batch']}x{r['seq']}"),
        ("prec", 4, lambda r: r["precision"]),
        ("train tok/s", 11, lambda r: _count(number(r["tokens_per_s"]))),
        ("MFU", 6, lambda r: _percent(number(r["mfu"]))),
        ("infer tok/s", 11, lambda r: _count(number(r["inference_tokens_per_s"]))),
        ("decode tok/s", 12, lambda r: _count(number(r["decode_tokens_per_s"]))),
        ("peak mem", 10, lambda r: _bytes(number(r["peak_memory_bytes"]))),
        ("compile s", 9, lambda r: f"{r['compile_s']:.1f}"),
    ]
    if any(row.get("mfu_measured") is not None for row in rows):
        columns.insert(6, ("MFU meas", 8, lambda r: _percent(number(r["mfu_measured"]))))
    if any(row.get("train_step_min_s") is not None for row in rows):
        columns.insert(5, ("step ms min-max", 15, _step_range))
    if any(row.get("moe_path") for row in rows):  # a mixture of experts: its path and memory
        columns.insert(4, ("moe", 6, lambda r: r.get("moe_path") or "-"))
        columns.insert(
            -1, ("step temp", 10, lambda r: _mebibytes(number(r.get("train_temp_bytes"))))
        )
    if with_peer:
        columns += [
            ("peer tok/s", 10, lambda r: _count(number(r["peer_tokens_per_s"]))),
            ("ratio", 6, lambda r: "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"),
            ("infer ratio", 11, lambda r: _ratio(number(r["inference_ratio"]))),
            ("decode ratio", 12, lambda r: _ratio(number(r["decode_ratio"]))),
        ]
    if any(row.get("floor_tokens_per_s") for row in rows):
        columns += [
            ("floor tok/s", 11, lambda r: _count(number(r.get("floor_tokens_per_s")))),
            ("vs floor", 8, lambda r: _ratio(number(r.get("floor_ratio")))),
            ("decode vs floor", 15, lambda r: _ratio(number(r.get("floor_decode_ratio")))),
        ]
    header = "  ".join(f"{name:>{width}}" for name, width, _ in columns)
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append("  ".join(f"{cell(row):>{width}}" for _, width, cell in columns))
    return "\n".join(lines)


def notes(rows: Sequence[Mapping[str, JSONValue]]) -> list[str]:
    """The lines under the table: the peaks MFU divides by, and why a number is missing."""
    lines = []
    for column, field in (("MFU", "mfu_peak"), ("MFU meas", "mfu_measured_peak")):
        for peak in sorted(_texts(rows, field)):
            lines.append(f"{column}: against {peak}")
    for reason in sorted(_texts(rows, "mfu_reason")):
        lines.append(f"MFU: {reason}")
    return lines


def _texts(rows: Sequence[Mapping[str, JSONValue]], field: str) -> set[str]:
    """The different texts `field` holds in `rows` (a label, a reason; nulls and "" left out)."""
    return {value for row in rows if isinstance(value := row.get(field), str) and value}


def _mebibytes(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f} MiB"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _step_range(row: Mapping[str, JSONValue]) -> str:
    low, high = number(row.get("train_step_min_s")), number(row.get("train_step_max_s"))
    if low is None or high is None:
        return "-"
    return f"{1e3 * low:.3g}-{1e3 * high:.3g}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def now_utc() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()


def result_path(
    directory: Path, date: str, device: Mapping[str, object], name: str = "bench"
) -> Path:
    """`<name>-<date>-<platform>[-<device kind>].json` under `directory` (`device` as
    `zoo.bench.hardware.device_info` describes it)."""
    stamp = re.sub(r"[^0-9T]", "", date)[:15]
    kind = "" if device["platform"] == "cpu" else f"-{device['device_kind']}"
    slug = re.sub(r"[^a-z0-9]+", "-", f"{device['platform']}{kind}".lower()).strip("-")
    return directory / f"{name}-{stamp}-{slug}.json"


def write_results(
    directory: Path,
    rows: Sequence[Mapping[str, object]],
    meta: Mapping[str, object],
    name: str = "bench",
) -> Path:
    """Write `{"meta": ..., "rows": [...]}` as JSON under `directory`; return the file.

    `meta` says when and where the rows were measured: its `date` (ISO 8601) and `device`
    (`device_info`) name the file; its other entries and the rows are JSON values."""
    date, device = meta["date"], meta["device"]
    if not isinstance(date, str) or not isinstance(device, Mapping):
        raise TypeError("meta needs a date (text) and a device (a mapping) to name the file")
    directory.mkdir(parents=True, exist_ok=True)
    path = result_path(directory, date, device, name)
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    return path
