"""`zoo train --config run.yaml`: the flags of a run in a YAML (or JSON) file.

Every flag can be given by its long name, with dashes or underscores (`batch-size: 10` or
`batch_size: 10`); a flag that repeats (`--data`, `--set`, `--role`, `--log`) takes a list.
Flags on the command line win over the file (a repeated one replaces the file's list whole).
A key that names no flag is refused with the closest flag's name.

A run records its full resolved config in `DIR/train_config.yaml` (`record_config`): every
option, the preset's defaults filled in, the data and template paths made absolute, so that
`zoo train --config DIR/train_config.yaml --out NEW` runs it again exactly.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

# a flag's value, as argparse or a --config file gives it (a repeated flag's: a list)
FlagValue = str | int | float | bool | list[str] | None
# the options of a run by name, as its flags give them: what `train_args.json` and
# `train_config.yaml` record
RunFlags = Mapping[str, FlagValue]

CONFIG_RECORD = "train_config.yaml"  # the resolved config a run records in its folder
# namespace entries that are not options of the run
# `loss_positions` is decided by `zoo train` itself (`zoo.cli._run_dir.run_loss_positions`)
NOT_OPTIONS = ("run", "command", "config", "loss_positions")
# where the namespace keeps the file's FLAVOR (a positional, given on the command line too)
CONFIG_FLAVOR = "_config_flavor"
# options that name files: recorded as absolute paths so the config reruns from anywhere
PATH_OPTIONS = ("template", "init")


def enable_config_file(parser: argparse.ArgumentParser) -> None:
    """Add `--config FILE` to `parser` (a sub-command's), read before its flags are parsed."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a YAML or JSON file of flags (long names as keys); command-line flags win",
    )
    parse_known = parser.parse_known_args

    def parse_with_config(
        args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        arguments = list(args or [])
        path = _config_path(arguments)
        if path is not None:
            try:
                values = read_config(path, parser)
            except (ValueError, FileNotFoundError) as error:
                parser.error(str(error))  # exits with status 2, as for any bad flag
            given = _given_on_command_line(arguments, parser)
            namespace = namespace or argparse.Namespace()
            for dest, value in values.items():
                if dest not in given:
                    setattr(namespace, dest, value)
        return parse_known(arguments, namespace)

    parser.parse_known_args = parse_with_config  # type: ignore[method-assign,assignment]


def _config_path(arguments: list[str]) -> str | None:
    for index, argument in enumerate(arguments):
        if argument == "--config" and index + 1 < len(arguments):
            return arguments[index + 1]
        if argument.startswith("--config="):
            return argument.partition("=")[2]
    return None


def _given_on_command_line(arguments: list[str], parser: argparse.ArgumentParser) -> set[str]:
    """The dests of the flags in `arguments` (abbreviations resolved as argparse does)."""
    options = {
        string: action.dest
        for action in parser._actions  # argparse keeps its actions there
        for string in action.option_strings
    }
    given = set()
    for argument in arguments:
        if not argument.startswith("--"):
            continue
        name = argument.partition("=")[0]
        if name in options:
            given.add(options[name])
            continue
        matches = {dest for string, dest in options.items() if string.startswith(name)}
        if len(matches) == 1:
            given |= matches
    return given


def read_config(path: str, parser: argparse.ArgumentParser) -> dict[str, object]:
    """The flags in the file `path` as `{dest: value}`, each checked as its flag checks it (the
    value its flag's type gives)."""
    values = _load(path)
    actions = {action.dest: action for action in parser._actions if action.option_strings}
    checked: dict[str, object] = {}
    for key, value in values.items():
        dest = str(key).replace("-", "_")
        if dest == "flavor":  # the positional FLAVOR, checked against the command line's
            checked[CONFIG_FLAVOR] = (str(value), path)
            continue
        if dest in NOT_OPTIONS or dest not in actions:
            flags = sorted(
                "--" + name.replace("_", "-") for name in actions if name not in NOT_OPTIONS
            )
            close = difflib.get_close_matches("--" + dest.replace("_", "-"), flags, n=1)
            hint = f"; the closest flag is {close[0]}" if close else ""
            raise ValueError(
                f"--config {path}: unknown key {key!r}, which names no flag of zoo train{hint}"
            )
        checked[dest] = _convert(actions[dest], value, key, path)
    return checked


def _load(path: str) -> dict[object, object]:
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"--config {path}: no such file")
    text = file.read_text(encoding="utf-8")
    try:
        if file.suffix == ".json":
            loaded = json.loads(text)
        else:
            import yaml

            loaded = yaml.safe_load(text)
    except Exception as error:  # yaml.YAMLError or json.JSONDecodeError: the file is bad
        raise ValueError(f"--config {path} cannot be read: {error}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValueError(
            f"--config {path} holds a {type(loaded).__name__}; it should map flag names to "
            "values (e.g. steps: 100)"
        )
    return loaded


def _convert(action: argparse.Action, value: object, key: object, path: str) -> object:
    """`value` as the flag of `action` would give it, refused naming the key."""
    where = f"--config {path}: {key}"
    if value is None:  # as if the flag were left out
        return action.default
    repeated = isinstance(action, argparse._AppendAction)
    if repeated or action.dest == "data":
        items = value if isinstance(value, list) else [value]
        converted = [_one(action, item, where) for item in items]
        return converted[0] if action.dest == "data" and len(converted) == 1 else converted
    if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
        if not isinstance(value, bool):
            raise ValueError(f"{where} is a switch: give true or false, not {value!r}")
        return value
    return _one(action, value, where)


def _one(action: argparse.Action, value: object, where: str) -> object:
    if isinstance(value, dict | list):
        raise ValueError(f"{where} takes one value, got {type(value).__name__} {value!r}")
    convert = action.type
    if convert is int and isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{where}: {value!r} is not a whole number")
    if callable(convert) and not isinstance(value, bool):
        try:
            value = _converted(convert, value)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as error:
            raise ValueError(f"{where}: {value!r} is not valid ({error})") from None
    elif convert is None and not isinstance(value, str):
        value = str(value)
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(str(choice) for choice in action.choices)
        raise ValueError(f"{where}: {value!r} is not one of {choices}")
    return value


def _converted(convert: Callable[[str], object], value: object) -> object:
    """`value` of a file through a flag's type: a number as it is to `int` and `float`
    (`int("1e-3")` would fail where 1e-3 reads), any other value as text."""
    if isinstance(value, int | float) and convert in (int, float):
        return float(value) if convert is float else int(value)
    return convert(str(value))


def required_options(args: argparse.Namespace, names: Sequence[str]) -> None:
    """Refuse a run without `--NAME` for each of `names` (on the command line or in
    `--config`)."""
    recorded = getattr(args, CONFIG_FLAVOR, None)
    if recorded is not None and recorded[0] != args.flavor:
        raise ValueError(
            f"--config {recorded[1]} is for zoo train {recorded[0]}, and this is zoo train "
            f"{args.flavor}: run zoo train {recorded[0]} --config {recorded[1]}"
        )
    for name in names:
        if getattr(args, name, None) in (None, []):
            flag = "--" + name.replace("_", "-")
            where = f" or in --config {args.config}" if getattr(args, "config", None) else ""
            raise ValueError(f"{flag} is required: give it on the command line{where}")


def resolved_config(flags: RunFlags, *, tokenizer_given: bool) -> dict[str, FlagValue]:
    """Every option of the run of `flags` (defaults filled), file paths made absolute: what
    `--config` reads back to rerun it."""
    config: dict[str, FlagValue] = {}
    for name, value in sorted(flags.items()):
        if name in NOT_OPTIONS or name.startswith("_"):
            continue
        if name in PATH_OPTIONS and isinstance(value, str) and os.path.exists(value):
            value = str(Path(value).resolve())
        config[name] = value
    data = flags["data"]
    specs = [data] if isinstance(data, str) else data if isinstance(data, list) else []
    config["data"] = [_absolute_spec(spec) for spec in specs]
    config["resume"] = False  # a rerun starts afresh (pass --resume to continue one)
    config["show_data"] = None
    if not tokenizer_given and flags.get("init") is not None:
        config["tokenizer"] = None  # the --init model's own, not a default
    return config


def _absolute_spec(spec: str) -> str:
    """`json:runs/x` -> `json:/abs/runs/x` (weight kept) where the path exists."""
    from zoo.cli._mixing import split_weight

    plain, weight = split_weight(spec)
    scheme, _, rest = plain.partition(":")
    if scheme != "synthetic" and rest and os.path.exists(rest):
        plain = f"{scheme}:{Path(rest).resolve()}"
    return plain if weight is None else f"{plain}:{weight}"


def record_config(out: Path, flags: RunFlags, *, tokenizer_given: bool) -> None:
    """Write `out/train_config.yaml`, the resolved config of the run of `flags` (see the module
    doc)."""
    import yaml

    from zoo.files import write_text_atomic

    config = resolved_config(flags, tokenizer_given=tokenizer_given)
    text = (
        "# zoo train's resolved config: zoo train --config THIS_FILE --out NEW reruns it\n"
        + yaml.safe_dump(config, sort_keys=True, default_flow_style=False)
    )
    write_text_atomic(out / CONFIG_RECORD, text)
