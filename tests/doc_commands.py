"""The fenced shell commands of README.md and docs/, and checks of them that run nothing.

A command is a line of a bash/console block, a `$ ` line of a transcript, or a line of an
unlabelled block that starts with a program (`zoo`, `python`, `pip`, `mkdocs`, `.venv/...`,
`benchmarks/...`); continuation lines, open quotes and `for` loops are joined to it.
`Checks` reads one command: each `zoo` invocation is parsed by zoo's own argument parser, its
presets, synthetic tasks, `--mesh`, `--lora` and `--freeze` are read by zoo's own readers, and
each local path it reads (data, model directory, `--init`, `--adapter`, a cache folder) must
exist relative to the checkout, be written by a documented command, or be the reader's own
data; `pip install` must install the checkout with extras that exist; `benchmarks/gpu.sh` must
take the options given. Used by tests/test_readme_commands.py.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console"}
# an unlabelled block mixes commands with output and file trees: a command starts with a program
PROGRAM = re.compile(
    r"\s*([A-Z_]+=\S+\s+)*((zoo|python3?|pip|mkdocs|taskset|srun)(\s|$)|\.venv/|benchmarks/)"
)
ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
OPERATORS = set(";&|")
KNOWN_ENV = {"XLA_FLAGS", "JAX_PLATFORMS", "TIKTOKEN_CACHE_DIR"}
PATH_ENV = {"TIKTOKEN_CACHE_DIR"}  # variables that name a folder the command reads
SHELL_TOOLS = {"mkdir", "cp", "wait", "uptime"}  # nothing of the project's to check


@dataclass(frozen=True)
class DocCommand:
    page: str  # relative to the checkout
    line: int  # 1-based line of its first line
    text: str  # as written, continuation lines included

    @property
    def key(self) -> str:
        """One line, comments dropped and whitespace collapsed: the form a table names it by."""
        lines = [without_comment(line) for line in self.text.splitlines()]
        return " ".join(" ".join(lines).replace("\\ ", " ").split())

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def without_comment(line: str) -> str:
    """The line up to a ` #` that is outside quotes."""
    for mark in re.finditer(r"\s#", line):
        before = line[: mark.start()]
        if before.count('"') % 2 == 0 and before.count("'") % 2 == 0:
            return before
    return line


def shell_tokens(text: str) -> list[str]:
    """Words and the operators `; & | && ||` of a command, comments dropped (POSIX quoting)."""
    lexer = shlex.shlex(text.replace("\\\n", " "), posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    return list(lexer)


def complete(text: str) -> bool:
    """Whether the lines so far end a command: no trailing backslash, closed quotes and loops."""
    if text.rstrip().endswith("\\"):
        return False
    try:
        words = shell_tokens(text)
    except ValueError:  # an open quote: the command goes on
        return False
    return words.count("do") == words.count("done")


def block_commands(lang: str, body: str) -> list[tuple[int, str]]:
    """(line offset, command text) of each command in one fenced block."""
    lines = body.splitlines()
    transcript = any(line.startswith("$ ") for line in lines)
    found: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for offset, line in enumerate(lines):
        if not pending:
            if transcript and not line.startswith("$ "):
                continue  # output
            line = line.removeprefix("$ ")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if lang == "" and not transcript and not PROGRAM.match(line):
                continue  # a file tree or output
            start = offset
        pending.append(line)
        if complete("\n".join(pending)):
            found.append((start, "\n".join(pending)))
            pending = []
    assert not pending, f"a command that never ends: {pending}"
    return found


def doc_commands(pages: list[Path] = PAGES) -> list[DocCommand]:
    commands = []
    for page in pages:
        text = page.read_text()
        name = page.relative_to(ROOT).as_posix()
        for block in FENCE.finditer(text):
            if block.group(1).lower() in SHELL_BLOCKS:
                first = text.count("\n", 0, block.start(2)) + 1
                for offset, command in block_commands(block.group(1).lower(), block.group(2)):
                    commands.append(DocCommand(name, first + offset, command))
    return commands


def simple_commands(text: str) -> list[list[str]]:
    """The argv of each simple command, `for NAME in VALUES; do ...; done` unrolled."""
    commands: list[list[str]] = [[]]
    for word in shell_tokens(text):
        if set(word) <= OPERATORS:
            commands.append([])
        else:
            commands[-1].append(word)
    unrolled: list[list[str]] = []
    loop: tuple[str, list[str], list[list[str]]] | None = None
    for argv in filter(None, commands):
        if argv[0] == "for":
            loop = (argv[1], argv[3:], [])
            continue
        argv = argv[1:] if argv[0] == "do" else argv
        if argv == ["done"] and loop is not None:
            name, values, body = loop
            unrolled += [[w.replace(f"${name}", v) for w in a] for v in values for a in body]
            loop = None
        elif argv:
            (loop[2] if loop else unrolled).append(argv)
    return unrolled


def split_env(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Leading `NAME=value` words and wrappers (`taskset -c CPUS`, `srun`) taken off."""
    env = {}
    while argv and ENV_ASSIGNMENT.match(argv[0]):
        name, _, value = argv[0].partition("=")
        env[name] = value
        argv = argv[1:]
    if argv[:2] == ["taskset", "-c"]:
        argv = argv[3:]
    elif argv[:1] == ["srun"]:
        argv = argv[1:]
    return env, argv


def zoo_invocations(command: DocCommand) -> list[list[str]]:
    return [a for _, a in map(split_env, simple_commands(command.text)) if a[:1] == ["zoo"]]


@functools.cache
def zoo_parser():
    from zoo.cli import build_parser

    return build_parser()


@functools.cache
def extras() -> frozenset[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return frozenset(project["optional-dependencies"])


@dataclass
class Docs:
    """What a command may rely on: the other commands, and paths no command writes."""

    commands: list[DocCommand]
    readers_data: set[str]  # stand for the reader's own files: a clone does not hold them
    written_elsewhere: set[str]  # written by a command run here (not a `zoo train --out`)
    written: set[str] = field(init=False)

    def __post_init__(self):
        self.written = set(self.written_elsewhere)
        for command in self.commands:
            for argv in zoo_invocations(command):
                if argv[1:2] == ["train"] and "--out" in argv:
                    self.written.add(argv[argv.index("--out") + 1].rstrip("/"))


class Checks:
    """The problems found in one command, and the paths left unchecked without ../shared."""

    def __init__(self, command: DocCommand, docs: Docs):
        self.command, self.docs = command, docs
        self.problems: list[str] = []
        self.needs_shared: list[str] = []
        for argv in simple_commands(command.text):
            env, argv = split_env(argv)
            self.env(env)
            if argv:
                self.argv(argv)

    def path_read(self, path: str, what: str) -> None:
        if path in self.docs.readers_data or self.is_written(path):
            return
        if path.startswith("../shared/") and not SHARED.is_dir():
            self.needs_shared.append(path)
        elif not (ROOT / path).exists():
            self.problems.append(f"{what} {path}: no such file beside the checkout")

    def is_written(self, path: str) -> bool:
        path = path.rstrip("/")
        return any(path == out or path.startswith(out + "/") for out in self.docs.written)

    def env(self, env: dict[str, str]) -> None:
        for name, value in env.items():
            if name not in KNOWN_ENV:
                self.problems.append(f"{name}=: an unknown variable (add it to KNOWN_ENV)")
            elif name in PATH_ENV:
                self.path_read(value, name)

    def argv(self, argv: list[str]) -> None:
        program, args = argv[0], argv[1:]
        if program in ("zoo", ".venv/bin/zoo"):
            self.zoo(args)
        elif program in ("pip", ".venv/bin/pip"):
            self.pip(args)
        elif program in ("python", "python3", ".venv/bin/python"):
            self.python(args)
        elif program == "mkdocs":
            self.mkdocs(args)
        elif program == "benchmarks/gpu.sh":
            self.gpu_script(args)
        elif program not in SHELL_TOOLS:
            self.problems.append(f"{program}: no check for this program; add one to Checks")

    def zoo(self, args: list[str]) -> None:
        if "--config" in args:  # read when the command runs: a file a command above may write
            at = args.index("--config")
            self.path_read(args[at + 1], "--config")
            args = args[:at] + args[at + 2 :]
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
                parsed = zoo_parser().parse_args(args)
        except SystemExit as exit:
            if exit.code:  # --help exits with 0
                self.problems.append(f"zoo {shlex.join(args)}: {errors.getvalue().strip()}")
            return
        options = vars(parsed)
        self.zoo_names(options)
        data = options.get("data")
        for spec in [data] if isinstance(data, str) else data or []:
            self.data(spec.rsplit(":", 1)[0] if spec.count(":") > 1 else spec)  # :WEIGHT
        for option in ("model", "init", "adapter"):
            if options.get(option) and not options[option].startswith("hf:"):
                self.path_read(options[option], option)
        if options.get("resume") and not self.trained_above(options["out"]):
            self.problems.append(f"--resume {options['out']}: no command above trains it")

    def zoo_names(self, options: dict) -> None:
        """Presets, and `--mesh`, `--lora`, `--freeze` read as `zoo train` reads them."""
        import zoo
        from zoo.cli._lora import parse_lora
        from zoo.distributed.mesh import parse_mesh
        from zoo.train.freeze import parse_freeze

        presets = options.get("preset") or []
        for preset in presets if isinstance(presets, list) else [presets]:
            if preset not in zoo.presets.names():
                self.problems.append(f"--preset {preset}: not a preset (zoo presets)")
            elif options.get("set"):
                self.settings(preset, options["set"])
        for option, read in (("mesh", parse_mesh), ("lora", parse_lora), ("freeze", parse_freeze)):
            try:
                if options.get(option):
                    read(options[option])
            except ValueError as error:
                self.problems.append(f"--{option}: {error}")

    def settings(self, preset: str, settings: list[str]) -> None:
        """`--set NAME=VALUE` changes the preset's config as `zoo train` changes it."""
        import zoo

        overrides: dict[str, object] = {}
        for setting in settings:  # as `zoo train` reads them: JSON, else the text
            name, _, text = setting.partition("=")
            try:
                overrides[name.strip()] = json.loads(text)
            except json.JSONDecodeError:
                overrides[name.strip()] = text
        try:
            zoo.presets.config(preset, **overrides)
        except ValueError as error:
            self.problems.append(f"--preset {preset} --set {' '.join(settings)}: {error}")

    def data(self, spec: str) -> None:
        from zoo.data import synthetic

        scheme, _, name = spec.partition(":")
        if scheme == "synthetic":
            if name not in synthetic.TASKS:
                self.problems.append(f"--data {spec}: no such synthetic task")
        elif scheme in ("json", "csv", "parquet", "text"):
            self.path_read(name, f"--data {scheme}:")
        elif scheme != "hf":
            self.problems.append(f"--data {spec}: an unknown scheme")

    def trained_above(self, out: str) -> bool:
        """Whether a command above on the same page trains into `out` without `--resume`."""
        for earlier in self.docs.commands:
            if earlier.page == self.command.page and earlier.line < self.command.line:
                for argv in zoo_invocations(earlier):
                    if argv[1:2] == ["train"] and out in argv and "--resume" not in argv:
                        return True
        return False

    def pip(self, args: list[str]) -> None:
        targets = [a for a in args[1:] if not a.startswith("-")]
        if args[:1] != ["install"] or not targets:
            self.problems.append(f"pip {shlex.join(args)}: expected pip install TARGET")
        for target in targets:
            name, _, wanted = target.partition("[")
            if name != ".":
                self.problems.append(
                    f"pip install {target}: install the checkout (not on PyPI): '.[EXTRAS]'"
                )
            for extra in filter(None, wanted.rstrip("]").split(",")):
                if extra not in extras():
                    self.problems.append(f"pip install {target}: no extra {extra!r}")

    def python(self, args: list[str]) -> None:
        if args[:2] == ["-m", "pip"]:
            self.pip(args[2:])
        elif not (args[:1] == ["-c"] or args[:2] in (["-m", "venv"], ["-m", "pytest"])):
            self.problems.append(f"python {shlex.join(args)}: no check for this; add one")

    def mkdocs(self, args: list[str]) -> None:
        if args[:1] not in (["serve"], ["build"]) or not set(args[1:]) <= {"--strict"}:
            self.problems.append(f"mkdocs {shlex.join(args)}: expected mkdocs serve|build --strict")
        if not (ROOT / "mkdocs.yml").is_file():
            self.problems.append("mkdocs: no mkdocs.yml")

    def gpu_script(self, args: list[str]) -> None:
        script = ROOT / "benchmarks" / "gpu.sh"
        if not os.access(script, os.X_OK):
            self.problems.append(f"{script.relative_to(ROOT)}: missing or not executable")
            return
        cases = script.read_text()
        for option in (a for a in args if a.startswith("-")):
            if not re.search(rf"^\s*(\S+\|)?{re.escape(option)}(\|\S+)?\)", cases, re.MULTILINE):
                self.problems.append(f"benchmarks/gpu.sh {option}: the script takes no such option")
