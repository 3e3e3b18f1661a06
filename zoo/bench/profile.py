"""Where a train step's time goes: a `jax.profiler` trace of a few steps, summed by HLO op.

`profile_run` traces `steps` calls of a `ZooRun`'s train step, keeps the trace, writes the
optimised HLO of the step, and summarises the trace: time per step by kind of work (matmul,
attention, elementwise, ...), by phase (forward, backward, optimizer) and by op, each op with
the zoo source lines it came from. On a GPU the time is the kernels' time on the device's
streams; on a CPU it is each op's own time on the threads that ran it (nested ops such as a
scanned layer's body are counted once, in the ops inside).

The summary needs nothing beyond JAX (the machine that runs the GPU suite has no network and
no xprof); the kept trace opens in https://ui.perfetto.dev or, with its `.xplane.pb`, in xprof.
"""

from __future__ import annotations

import gzip
import json
import shutil
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NotRequired, TypedDict, TypeVar

import jax

from zoo.bench.hlo_ops import CATEGORIES, Program, kernel_category, parse_program
from zoo.bench.run_zoo import ZooRun
from zoo.files import JSONObject, JSONValue

# Device threads that repeat the streams' work as summaries (counting them would count twice).
_SUMMARY_THREADS = ("XLA Ops", "XLA Modules", "Steps", "Framework", "TensorFlow", "Source")
State = TypeVar("State")
# A trace event (Chrome's JSON trace format): `ph` its kind, `pid` / `tid` where it ran, `ts`
# and `dur` in microseconds, `args` its details.
Event = JSONObject
Thread = tuple[JSONValue, JSONValue]  # (pid, tid)


class OpSpan(TypedDict):
    """One span of work in a trace, in microseconds."""

    op: str | None  # the HLO instruction it ran for (None: a copy between host and device)
    kernel: str  # the event's name
    ts: float
    dur: float
    self: float  # `dur` less the spans inside it (on the host; on a device, `dur`)


class Share(TypedDict):
    """The time of a category or phase of work, per step."""

    ms: float
    share: float  # of the op time
    ops: int


class OpRow(TypedDict):
    """One op of the step (`top`), its time per step and where it came from."""

    op: str
    category: str
    phase: str
    source: str  # the zoo source lines
    shape: str
    ms: float
    share: float
    calls_per_step: float


class KernelRow(TypedDict):
    """One kernel on the device, its time per step and the op it ran for."""

    kernel: str
    op: str
    ms: float
    calls_per_step: float


class ProfileSummary(TypedDict):
    """What `summarize` finds in a trace (and `profile_run` writes as `TAG.profile.json`)."""

    module: str
    steps: int
    origin: str  # "device" (kernels on its streams) or "host" (ops on threads)
    op_ms_per_step: float
    busy_ms_per_step: float
    wall_ms_per_step: float | None
    categories: dict[str, Share]
    phases: dict[str, Share]
    top: list[OpRow]
    ops: int
    kernels: NotRequired[list[KernelRow]]  # on a device
    # added by `profile_run`: the row profiled and the files written
    preset: NotRequired[str]
    batch: NotRequired[int]
    seq: NotRequired[int]
    precision: NotRequired[str]
    device: NotRequired[str]
    files: NotRequired[dict[str, str]]


class _Time(TypedDict):
    us: float
    calls: int


class _KernelTime(_Time):
    op: str


def _args(event: Event) -> JSONObject:
    """The event's `args` (`{}` when it has none)."""
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _micros(value: JSONValue) -> float:
    """A time of the trace (`ts`, `dur`), in microseconds."""
    if isinstance(value, int | float | str):
        return float(value)
    raise ValueError(f"a trace time should be a number, found {type(value).__name__}")


def _names(events: list[Event]) -> tuple[dict[JSONValue, str], dict[Thread, str]]:
    processes: dict[JSONValue, str] = {}
    threads: dict[Thread, str] = {}
    for event in events:
        if event.get("ph") != "M":
            continue
        name = str(_args(event).get("name", ""))
        if event.get("name") == "process_name":
            processes[event.get("pid")] = name
        elif event.get("name") == "thread_name":
            threads[(event.get("pid"), event.get("tid"))] = name
    return processes, threads


def _module_matches(event: Event, module: str) -> bool:
    found = str(_args(event).get("hlo_module", ""))
    return found == module or found.startswith(module + "(")


def op_spans(events: list[Event], module: str) -> tuple[list[OpSpan], str]:
    """The trace's spans of work, each `{op, kernel, ts, dur, self}` (microseconds).

    On a device (a process named `/device:...`): every kernel on its streams; `op` is the HLO
    instruction it ran for (None for copies between host and device). On the host: the spans of
    `module`'s instructions, with `self` their duration less that of the spans inside them.
    Returns the spans and where they came from ("device" or "host").
    """
    processes, threads = _names(events)
    spans = [event for event in events if event.get("ph") == "X" and "dur" in event]
    devices = {pid for pid, name in processes.items() if name.startswith("/device:")}
    chosen: list[OpSpan] = []
    if devices:
        for event in spans:
            thread = threads.get((event.get("pid"), event.get("tid")), "")
            if event.get("pid") in devices and not thread.startswith(_SUMMARY_THREADS):
                op = _args(event).get("hlo_op") if _module_matches(event, module) else None
                chosen.append(_span(event, op))
        if chosen:
            return chosen, "device"
    by_thread: dict[Thread, list[OpSpan]] = defaultdict(list)
    for event in spans:
        if "hlo_op" in _args(event) and _module_matches(event, module):
            span = _span(event, _args(event)["hlo_op"])
            by_thread[(event.get("pid"), event.get("tid"))].append(span)
    for thread_spans in by_thread.values():
        thread_spans.sort(key=lambda span: (span["ts"], -span["dur"]))
        open_spans: list[OpSpan] = []
        for span in thread_spans:
            while open_spans and open_spans[-1]["ts"] + open_spans[-1]["dur"] <= span["ts"]:
                open_spans.pop()
            if open_spans:  # inside a loop or call: its time is this span's, not the parent's
                open_spans[-1]["self"] -= span["dur"]
            open_spans.append(span)
        chosen += thread_spans
    return chosen, "host"


def _span(event: Event, op: JSONValue) -> OpSpan:
    """The span of work `event` records, run for the HLO instruction `op`."""
    duration = _micros(event["dur"])
    return OpSpan(
        op=None if op is None else str(op),
        kernel=str(event["name"]),
        ts=_micros(event["ts"]),
        dur=duration,
        self=duration,
    )


def busy_time(spans: Iterable[OpSpan]) -> float:
    """Microseconds during which at least one span ran (the union of their intervals)."""
    total, end = 0.0, float("-inf")
    for span in sorted(spans, key=lambda span: span["ts"]):
        start, stop = span["ts"], span["ts"] + span["dur"]
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summarize(
    events: list[Event],
    program: Program,
    module: str,
    *,
    steps: int,
    wall_s: list[float] | None = None,
    top: int = 15,
) -> ProfileSummary:
    """Time per step by category, phase, op and (on a device) kernel; see the module docstring."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    spans, origin = op_spans(events, module)
    if not spans:
        raise ValueError(
            f"the trace has no spans of {module!r}: was the step run inside the trace, and does "
            "the trace come from this program?"
        )
    per_op: dict[str, _Time] = {}
    kernels: dict[str, _KernelTime] = {}
    for span in spans:
        op = span["op"]
        key = op if op is not None else f"[{span['kernel']}]"
        entry = per_op.setdefault(key, _Time(us=0.0, calls=0))
        entry["us"] += max(span["self"], 0.0)
        entry["calls"] += 1
        if origin == "device":
            kernel = kernels.setdefault(span["kernel"], _KernelTime(us=0.0, calls=0, op=key))
            kernel["us"] += span["dur"]
            kernel["calls"] += 1
    total_us = sum(entry["us"] for entry in per_op.values())
    ms = 1e-3 / steps  # microseconds over all steps -> milliseconds per step

    def share(us: float) -> float:
        return us / total_us if total_us else 0.0

    categories: dict[str, Share] = {}
    phases: dict[str, Share] = {}
    rows: list[OpRow] = []
    for key, entry in per_op.items():
        if key.startswith("["):
            category, phase, source = kernel_category(key), "other", ""
        else:
            category, phase, source = program.category(key), program.phase(key), program.source(key)
        for table, name in ((categories, category), (phases, phase)):
            slot = table.setdefault(name, Share(ms=0.0, share=0.0, ops=0))
            slot["ms"] += entry["us"] * ms
            slot["share"] += share(entry["us"])
            slot["ops"] += 1
        instruction = program.instructions.get(key)
        rows.append(
            OpRow(
                op=key,
                category=category,
                phase=phase,
                source=source,
                shape=_short(instruction.shape) if instruction else "",
                ms=entry["us"] * ms,
                share=share(entry["us"]),
                calls_per_step=entry["calls"] / steps,
            )
        )
    rows.sort(key=lambda row: -row["ms"])
    order = {name: index for index, name in enumerate(CATEGORIES)}
    summary = ProfileSummary(
        module=module,
        steps=steps,
        origin=origin,
        op_ms_per_step=total_us * ms,
        busy_ms_per_step=busy_time(spans) * ms,
        wall_ms_per_step=statistics.median(wall_s) * 1e3 if wall_s else None,
        categories=dict(sorted(categories.items(), key=lambda item: order.get(item[0], 99))),
        phases=dict(sorted(phases.items(), key=lambda item: -item[1]["ms"])),
        top=rows[:top],
        ops=len(rows),
    )
    if kernels:
        ranked = sorted(kernels.items(), key=lambda item: -item[1]["us"])[:top]
        summary["kernels"] = [
            KernelRow(
                kernel=name[:160],
                op=entry["op"],
                ms=entry["us"] * ms,
                calls_per_step=entry["calls"] / steps,
            )
            for name, entry in ranked
        ]
    return summary


def _short(shape: str, limit: int = 48) -> str:
    """A shape for a table: tuples (loop carries) cut to `limit` characters."""
    return shape if len(shape) <= limit else shape[: limit - 3] + "..."


def format_summary(summary: ProfileSummary, title: str = "") -> str:
    """The summary as a few short tables (categories, phases, the top ops)."""
    wall = summary["wall_ms_per_step"]
    where = "kernels on the device" if summary["origin"] == "device" else "ops on host threads"
    lines = [
        f"profile {title}: {summary['steps']} traced steps, {where}",
        f"  per step: wall {wall:.2f} ms" if wall is not None else "  per step:",
    ]
    lines[-1] += (
        f", busy {summary['busy_ms_per_step']:.2f} ms, op time {summary['op_ms_per_step']:.2f} ms"
    )
    if summary["origin"] == "host":
        lines.append("  (op time adds up the threads: it can exceed the wall time)")
    lines.append(f"  {'category':<15} {'ms/step':>9} {'share':>7} {'ops':>5}")
    for name, slot in summary["categories"].items():
        lines.append(f"  {name:<15} {slot['ms']:>9.3f} {slot['share']:>6.1%} {slot['ops']:>5}")
    lines.append(
        "  phases: "
        + ", ".join(f"{name} {slot['share']:.1%}" for name, slot in summary["phases"].items())
    )
    lines.append(f"  {'ms/step':>9} {'share':>6}  {'category':<14} {'phase':<9} op / source")
    for row in summary["top"]:
        lines.append(
            f"  {row['ms']:>9.3f} {row['share']:>6.1%}  {row['category']:<14} {row['phase']:<9} "
            f"{row['op']} {row['shape']}  {row['source']}"
        )
    return "\n".join(lines)


def read_trace(path: Path) -> list[Event]:
    """The events of a Chrome/Perfetto JSON trace (`.json` or `.json.gz`)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as file:
        data: JSONValue = json.load(file)
    events = data["traceEvents"] if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{path} holds no list of trace events")
    return [event for event in events if isinstance(event, dict)]


def trace_calls(
    call: Callable[[State], State], state: State, steps: int, directory: Path
) -> tuple[State, list[float], Path]:
    """Run `state = call(state)` `steps` times under the profiler, waiting for each.

    Returns the last state, each call's wall time and the trace (`perfetto_trace.json.gz`)
    under `directory`.
    """
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # Python frames would bury the ops (and slow every step)
    wall = []
    with jax.profiler.trace(str(directory), create_perfetto_trace=True, profiler_options=options):
        for _ in range(steps):
            start = time.perf_counter()
            state = call(state)
            jax.block_until_ready(state)
            wall.append(time.perf_counter() - start)
    traces = sorted(directory.glob("plugins/profile/*/perfetto_trace.json.gz"))
    if not traces:
        raise RuntimeError(f"jax.profiler wrote no perfetto trace under {directory}")
    return state, wall, traces[-1]


def module_name(hlo_text: str) -> str:
    """`jit_train_step` from the `HloModule jit_train_step, ...` line."""
    first = hlo_text.split("\n", 1)[0]
    if not first.startswith("HloModule "):
        raise ValueError("not HLO text: it should start with `HloModule NAME`")
    return first.split()[1].rstrip(",")


def profile_run(run: ZooRun, directory: Path, *, steps: int = 3, top: int = 15) -> ProfileSummary:
    """Trace `steps` train steps of a started `ZooRun`; write and return the summary.

    Writes, under `directory`, `TAG.profile.json` (the summary), `TAG.hlo.txt` (the optimised
    step), `TAG.trace.json.gz` (open in Perfetto) and `TAG.xplane.pb` (open in xprof), where TAG
    is `preset-BATCHxSEQ-precision`.
    """
    if steps < 1:
        raise ValueError(f"--profile-steps must be >= 1, got {steps}")
    spec = run.spec
    tag = f"{spec.preset}-{spec.batch}x{spec.seq}-{spec.precision}"
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with jax.numpy_dtype_promotion("standard"):
        # the step is in JAX's caches by now: this neither traces nor compiles again
        hlo_text = run.lowered_step().compile().compiled.as_text()
        if hlo_text is None:  # the HLO names the ops the trace times
            raise RuntimeError(f"the {jax.default_backend()} backend gives no text of the step")
        raw = directory / f"{tag}.raw"
        shutil.rmtree(raw, ignore_errors=True)
        run.train.state, wall, trace = trace_calls(run.train.call, run.train.state, steps, raw)
    (directory / f"{tag}.hlo.txt").write_text(hlo_text)
    kept_trace = directory / f"{tag}.trace.json.gz"
    shutil.move(str(trace), kept_trace)
    files = dict(summary=f"{tag}.profile.json", hlo=f"{tag}.hlo.txt", trace=kept_trace.name)
    for xplane in trace.parent.glob("*.xplane.pb"):
        shutil.move(str(xplane), directory / f"{tag}.xplane.pb")
        files["xplane"] = f"{tag}.xplane.pb"
    shutil.rmtree(raw, ignore_errors=True)
    summary = summarize(
        read_trace(kept_trace),
        parse_program(hlo_text),
        module_name(hlo_text),
        steps=steps,
        wall_s=wall,
        top=top,
    )
    summary["preset"], summary["batch"], summary["seq"] = spec.preset, spec.batch, spec.seq
    summary["precision"] = spec.precision
    summary["device"] = str(jax.devices()[0].device_kind)
    summary["files"] = files
    (directory / f"{tag}.profile.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
