"""What each instruction of a compiled XLA program is: its kind of work and the source it came from.

Reads the optimised HLO text (`jax.stages.Compiled.as_text()`): every instruction's opcode, the
computations a fusion or a loop calls, custom-call targets (cuBLAS, cuDNN), and the Python
frames XLA kept for it (the `FileNames` / `StackFrames` tables, or `source_file` in older text).
`zoo.bench.profile` joins these with the names in a profiler trace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The categories a profile reports, in the order it prints them.
CATEGORIES = (
    "matmul",
    "attention",
    "reduction",
    "elementwise",
    "copy/layout",
    "gather/scatter",
    "collective",
    "memcpy",
    "control",
    "other",
)
# Opcodes that only move or relabel data.
_LAYOUT = {
    "copy",
    "transpose",
    "slice",
    "concatenate",
    "pad",
    "dynamic-slice",
    "dynamic-update-slice",
    "reverse",
}
# Opcodes that compute nothing by themselves (operands, plumbing).
_PLUMBING = {
    "parameter",
    "constant",
    "bitcast",
    "reshape",
    "broadcast",
    "tuple",
    "get-tuple-element",
    "iota",
    "bitcast-convert",
}
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_CONTROL = {"while", "conditional", "call"}


@dataclass
class Instruction:
    """One HLO instruction: `name = shape opcode(operands), attributes`."""

    name: str
    opcode: str
    shape: str
    calls: list[str] = field(default_factory=list)  # computations it runs (fusion, loop body)
    target: str = ""  # custom-call target
    backend: str = ""  # backend_config (e.g. a Triton GEMM fusion's kind)
    op_name: str = ""  # the JAX operation's path, e.g. jit(step)/transpose(jvp(...))/dot_general
    frame: int | None = None  # stack_frame_id into the module's frame table
    source: str = ""  # `file:line` when the text gives it inline (older XLA)


@dataclass
class Program:
    """A parsed HLO module: its instructions by name and its computations' instructions."""

    instructions: dict[str, Instruction]
    computations: dict[str, list[str]]  # computation name -> its instruction names
    frames: dict[int, tuple[str, str, int, int | None]]  # id -> (file, function, line, parent)

    def category(self, name: str) -> str:
        """The kind of work instruction `name` does (one of `CATEGORIES`); "other" if unknown."""
        instruction = self.instructions.get(name)
        if instruction is None:
            return "other"
        opcodes, targets = self._contents(instruction)
        text = " ".join(targets).lower() + " " + instruction.backend.lower()
        if "fmha" in text or "flash" in text or "attention" in text:
            return "attention"
        if any(opcode.startswith(_COLLECTIVES) for opcode in opcodes):
            return "collective"
        if {"dot", "convolution"} & opcodes or "gemm" in text or "matmul" in text:
            return "matmul"
        if instruction.opcode in _CONTROL:
            return "control"
        if {"gather", "scatter"} & opcodes:
            return "gather/scatter"
        if {"reduce", "reduce-window", "sort"} & opcodes:
            return "reduction"
        working = opcodes - _PLUMBING - {"fusion"}
        if working <= _LAYOUT:
            return "copy/layout"
        if "custom-call" in working:
            return "other"
        return "elementwise"

    def _contents(self, instruction: Instruction) -> tuple[set[str], set[str]]:
        """Opcodes and custom-call targets of an instruction and of the fusions it calls."""
        opcodes, targets = {instruction.opcode}, {instruction.target} - {""}
        if instruction.opcode in _CONTROL:  # a loop's body is profiled op by op, not here
            return opcodes, targets
        inner_opcodes, inner_targets = self.reach(instruction.calls)
        return opcodes | inner_opcodes, targets | inner_targets

    def reach(self, computations: list[str]) -> tuple[set[str], set[str]]:
        """Opcodes and custom-call targets in these computations and all they call."""
        opcodes: set[str] = set()
        targets: set[str] = set()
        pending, seen = list(computations), set()
        while pending:
            computation = pending.pop()
            if computation in seen:
                continue
            seen.add(computation)
            for inner_name in self.computations.get(computation, []):
                inner = self.instructions[inner_name]
                opcodes.add(inner.opcode)
                if inner.target:
                    targets.add(inner.target)
                pending.extend(inner.calls)
        return opcodes, targets

    def phase(self, name: str) -> str:
        """optimizer (optax frames), backward (transposed JAX ops), forward (model or loss
        frames) or other (gradient scaling, copies of the step's outputs)."""
        instruction = self.instructions.get(name)
        if instruction is None:
            return "other"
        files = [file for file, *_ in self.stack(name)]
        if any("/optax/" in file for file in files):
            return "optimizer"
        if "transpose(" in instruction.op_name:
            return "backward"
        if any(f"/zoo/{part}/" in file for file in files for part in ("nn", "models", "tasks")):
            return "forward"
        return "other"

    def stack(self, name: str) -> list[tuple[str, str, int]]:
        """The Python frames of an instruction, innermost first: (file, function, line)."""
        instruction = self.instructions.get(name)
        if instruction is None or instruction.frame is None:
            return []
        frames: list[tuple[str, str, int]] = []
        frame_id: int | None = instruction.frame
        seen: set[int] = set()
        while frame_id is not None and frame_id in self.frames and frame_id not in seen:
            seen.add(frame_id)
            file, function, line, parent = self.frames[frame_id]
            frames.append((file, function, line))
            frame_id = parent
        return frames

    def source(self, name: str, package: str = "zoo", depth: int = 2) -> str:
        """The innermost `depth` frames inside `package`, e.g. `nn/linear.py:35 < nn/mlp.py:77`."""
        instruction = self.instructions.get(name)
        if instruction is None:
            return ""
        marker = f"/{package}/"
        found = []
        for file, _, line in self.stack(name):
            where = f"{file.rsplit(marker, 1)[-1]}:{line}"
            if marker in file and "/site-packages/" not in file and where not in found:
                found.append(where)
                if len(found) == depth:
                    break
        return " < ".join(found) or instruction.source


_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s+\(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_CALLS = re.compile(
    r"\b(?:calls|to_apply|body|condition|branch_computations)=(\{[^}]*\}|%?[\w.\-]+)"
)
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_FRAME = re.compile(r"stack_frame_id=(\d+)")
_SOURCE = re.compile(r'source_file="([^"]*)"\s+source_line=(\d+)')
_BACKEND = re.compile(r"backend_config=(\{.*?\}|\"[^\"]*\")(?:,\s*\w+=|$)")


def _split_shape(rest: str) -> tuple[str, str]:
    """`f32[2]{0} add(...), ...` -> (shape, `add(...), ...`); tuple shapes are parenthesised."""
    if rest.startswith("("):
        depth = 0
        for index, char in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                return rest[: index + 1], rest[index + 1 :].lstrip()
        return rest, ""
    shape, _, tail = rest.partition(" ")
    return shape, tail


def parse_instruction(line: str) -> Instruction | None:
    """One instruction line of HLO text, or None for anything else."""
    match = _INSTRUCTION.match(line)
    if match is None:
        return None
    name, rest = match.groups()
    shape, tail = _split_shape(rest)
    opcode = tail.split("(", 1)[0].strip()
    if not opcode or " " in opcode:
        return None
    instruction = Instruction(name=name, opcode=opcode, shape=shape)
    for calls in _CALLS.findall(tail):
        names = calls.strip("{}").split(",")
        instruction.calls += [part.strip().lstrip("%") for part in names if part.strip()]
    if found := _TARGET.search(tail):
        instruction.target = found.group(1)
    if found := _BACKEND.search(tail):
        instruction.backend = found.group(1)[:200]
    if found := _OP_NAME.search(tail):
        instruction.op_name = found.group(1)
    if found := _FRAME.search(tail):
        instruction.frame = int(found.group(1))
    if found := _SOURCE.search(tail):
        instruction.source = f"{found.group(1)}:{found.group(2)}"
    return instruction


def _table(text: str, title: str) -> dict[int, str]:
    """A numbered table of the module's header (`FileNames`, `StackFrames`, ...)."""
    found = re.search(rf"^{title}\n((?:\d+ .*\n?)+)", text, re.MULTILINE)
    if found is None:
        return {}
    rows = (line.split(" ", 1) for line in found.group(1).splitlines())
    return {int(number): value for number, value in rows}


def _fields(value: str) -> dict[str, int]:
    return {key: int(number) for key, number in re.findall(r"(\w+)=(\d+)", value)}


def _frames(text: str) -> dict[int, tuple[str, str, int, int | None]]:
    """Frame id -> (file, function, line, parent frame id or None) from the module's tables."""
    files = {key: value.strip('"') for key, value in _table(text, "FileNames").items()}
    functions = {key: value.strip('"') for key, value in _table(text, "FunctionNames").items()}
    locations = {}
    for key, value in _table(text, "FileLocations").items():
        parts = _fields(value)
        locations[key] = (
            files.get(parts.get("file_name_id", 0), "?"),
            functions.get(parts.get("function_name_id", 0), "?"),
            parts.get("line", 0),
        )
    frames = {}
    for key, value in _table(text, "StackFrames").items():
        parts = _fields(value)
        # The table numbers frames from 1 and prints a parent as its number + 1 (1: no parent).
        parent = parts.get("parent_frame_id", 1) - 1
        location = locations.get(parts.get("file_location_id", 0), ("?", "?", 0))
        frames[key] = (*location, parent if parent >= 1 else None)
    return frames


def parse_program(text: str) -> Program:
    """Parse optimised HLO text (one module) into a `Program`."""
    instructions: dict[str, Instruction] = {}
    computations: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line and not line[0].isspace():
            found = _COMPUTATION.match(line)
            current = computations.setdefault(found.group(1), []) if found else None
            continue
        if current is None:
            continue
        instruction = parse_instruction(line)
        if instruction is not None:
            instructions[instruction.name] = instruction
            current.append(instruction.name)
    return Program(instructions, computations, _frames(text))


def kernel_category(kernel: str) -> str:
    """The category of a GPU kernel known only by its name (no HLO instruction attached)."""
    name = kernel.lower()
    if "memcpy" in name or "memset" in name:
        return "memcpy"
    if "fmha" in name or "flash" in name:
        return "attention"
    if "nccl" in name:
        return "collective"
    if any(word in name for word in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul")):
        return "matmul"
    return "other"
