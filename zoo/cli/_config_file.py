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
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from zoo.cli._config_load import load_config_file, shown
from zoo.cli._numbers import Real
from zoo.cli._trl_names import ALIASES, alias_of, refusal_of, same_as_zoo, trl_value

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
# options of which a run takes one: the command line's replaces the file's
ONE_OF = (("steps", "epochs"),)
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
            for group in ONE_OF:  # --steps on the command line replaces the file's epochs
                if given & set(group):
                    given |= set(group)
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
    value its flag's type gives); TRL/HF names are read as zoo's flags (`zoo.cli._trl_names`,
    said in one line). Every bad key is refused at once, one line each."""
    values = load_config_file(path)
    actions = {action.dest: action for action in parser._actions if action.option_strings}
    checked: dict[str, object] = {}
    setters: dict[str, tuple[object, object]] = {}  # dest -> the key and value that set it
    aliased: list[str] = []
    problems: list[str] = []
    for key, value in values.items():
        dest = str(key).replace("-", "_")
        if dest == "flavor":  # the positional FLAVOR, checked against the command line's
            checked[CONFIG_FLAVOR] = (str(value), path)
            continue
        if dest not in actions and same_as_zoo(str(key), value):
            aliased.append(f"{key} {value} (zoo's own)")
            continue
        try:
            if dest not in NOT_OPTIONS and dest in actions:
                converted = _convert(actions[dest], value, key, path)
            else:
                dest, converted = _trl_key(str(key), value, actions, path)
                if converted != actions[dest].default:
                    aliased.append(f"{key} -> --{dest.replace('_', '-')}")
        except ValueError as error:
            problems.append(str(error))
            continue
        if dest in setters:
            first_key, first_value = setters[dest]
            flag = "--" + dest.replace("_", "-")
            problems.append(
                f"--config {path}: {first_key} and {key} both set {flag} ({shown(first_value)} and "
                f"{shown(value)}); keep one"
            )
            continue
        setters[dest] = (key, value)
        checked[dest] = converted
    if problems:
        raise ValueError("\n".join(problems))
    batch = _combine_trl_batch(values, checked)
    if aliased:
        print(f"zoo train: --config {path}: TRL/HF names read as zoo's: "
              f"{', '.join(aliased)}{batch}", file=sys.stderr)  # fmt: skip
    return checked


def _trl_key(
    key: str, value: object, actions: Mapping[str, argparse.Action], path: str
) -> tuple[str, object]:
    """The zoo flag (dest) and value of the TRL/HF name `key`; ValueError for a key that names
    neither, with the reason or the closest flag."""
    alias = alias_of(key)
    if alias is not None and alias.flag in actions:
        try:
            converted = trl_value(key, alias, value)
        except ValueError as error:
            raise ValueError(f"--config {path}: {error}") from None
        if converted is None:
            return alias.flag, actions[alias.flag].default
        return alias.flag, _convert(actions[alias.flag], converted, key, path)
    reason = refusal_of(key)
    if reason is not None:
        raise ValueError(f"--config {path}: {key}: {reason}")
    candidates = {
        name: "--" + name.replace("_", "-") for name in actions if name not in NOT_OPTIONS
    }
    for name, known in ALIASES.items():
        candidates[name] = f"--{known.flag.replace('_', '-')} (TRL's {name})"
    close = difflib.get_close_matches(key.replace("-", "_"), list(candidates), n=1)
    hint = f"; the closest flag is {candidates[close[0]]}" if close else ""
    raise ValueError(
        f"--config {path}: unknown key {shown(key)}, which names no flag of zoo train{hint}"
    )


def _combine_trl_batch(values: Mapping[object, object], checked: dict[str, object]) -> str:
    """TRL's batch is one forward pass's, zoo's one optimizer step's: `--batch-size` becomes
    `per_device_train_batch_size` times `gradient_accumulation_steps`; returns what to say."""
    per_pass, passes = checked.get("batch_size"), checked.get("accumulate")
    if "per_device_train_batch_size" not in values or not isinstance(per_pass, int):
        return ""
    if not isinstance(passes, int) or passes == 1:
        return ""
    checked["batch_size"] = per_pass * passes
    return (f" (--batch-size is a step's batch: {per_pass} x gradient_accumulation_steps "
            f"{passes} = {per_pass * passes}, cut into {passes} micro-batches)")  # fmt: skip


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
            raise ValueError(f"{where} is a switch: give true or false, not {shown(value)}")
        return value
    return _one(action, value, where)


def _one(action: argparse.Action, value: object, where: str) -> object:
    if isinstance(value, dict | list):
        raise ValueError(f"{where} takes one value, got {type(value).__name__} {shown(value)}")
    convert = action.type
    if convert is int and isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{where}: {shown(value)} is not a whole number")
    if callable(convert) and not isinstance(value, bool):
        try:
            value = _converted(convert, value)
        except argparse.ArgumentTypeError as error:  # the flag's type says what it takes
            raise ValueError(f"{where}: {error}") from None
        except (TypeError, ValueError) as error:
            raise ValueError(f"{where}: {shown(value)} is not valid ({error})") from None
    elif convert is None and not isinstance(value, str):
        value = str(value)
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(str(choice) for choice in action.choices)
        raise ValueError(f"{where}: {shown(value)} is not one of {choices}")
    return value


def _converted(convert: Callable[[str], object], value: object) -> object:
    """`value` of a file through a flag's type: a number as it is to `int` and `float`
    (`int("1e-3")` would fail where 1e-3 reads), any other value as text."""
    if isinstance(value, int | float) and convert in (int, float):
        return float(value) if convert is float else int(value)
    if isinstance(value, float) and value.is_integer() and not isinstance(convert, Real):
        value = int(value)  # HF writes num_train_epochs: 3.0 for a whole-number flag
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
    if config.get("epochs") is not None:
        config["steps"] = None  # the epochs decide, as they did
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
