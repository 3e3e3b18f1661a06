"""The `zoo` command line. Each module in this package adds one sub-command via `register`."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import signal
import sys
import warnings
from collections.abc import Callable

from zoo.cli._mesh import join_processes, quiet_other_processes
from zoo.host import tune_host_allocator
from zoo.text import printable


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zoo", description="Transformers in JAX + Equinox: create, train, run, benchmark."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "register"):
            module.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt as stop:  # Ctrl-C while the commands' modules load
        return _interrupted("zoo", stop)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    shown, warnings.showwarning = warnings.showwarning, _one_line_warning(args.command)
    try:
        joined = join_processes(args)  # before anything starts JAX's backend
        tune_host_allocator()
        if joined:
            quiet_other_processes()
        return int(args.run(args) or 0)
    # ImportError: an optional package is missing; the message says which extra installs it.
    except (ValueError, KeyError, FileNotFoundError, TypeError, ImportError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        _say(f"zoo {args.command}: error: {message}")
        return 2
    # OSError: the world failed (hub unreachable, disk full, permissions): one line, status 1.
    except OSError as error:
        _say(f"zoo {args.command}: error: {error}")
        return 1
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM where a command turns it into one
        return _interrupted(f"zoo {args.command}", stop)
    finally:
        warnings.showwarning = shown


def _say(line: str) -> None:
    """Print a line of the CLI's own on stderr: an error or a warning, whose message may quote
    data (a row, a value, a template's words), so its control characters are shown escaped."""
    print(f"{_process_label()}{printable(line)}", file=sys.stderr)


def _interrupted(command: str, stop: KeyboardInterrupt) -> int:
    """One line for Ctrl-C (status 130, as a shell gives) or SIGTERM (`exit_status`: 143)
    instead of a traceback; what the command was writing it removed on the way out."""
    status = getattr(stop, "exit_status", 128 + signal.SIGINT)
    cause = "terminated (SIGTERM)" if status == 128 + signal.SIGTERM else "interrupted"
    print(f"{command}: {cause}", file=sys.stderr)
    return status


def _one_line_warning(command: str) -> Callable[..., None]:
    """Warnings as the CLI's errors are printed (`zoo train: warning: ...`), not in Python's
    `file:line: UserWarning:` form with the source line below it."""

    def show(
        message: Warning | str, category: type[Warning], *rest: object, **named: object
    ) -> None:
        _say(f"zoo {command}: warning: {message}")

    return show


def _process_label() -> str:
    """`[process 1/2] ` in a run of many processes (whose errors all reach one terminal)."""
    import jax

    if not jax.distributed.is_initialized():
        return ""
    from zoo.distributed.hosts import process_label

    return process_label()


if __name__ == "__main__":
    sys.exit(main())
