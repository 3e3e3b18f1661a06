"""A `--config` file read as the untrusted input it may be: a mapping of flag names to values.

The file is refused, naming it and the reason in one line, when it is missing, a folder, over
`MAX_CONFIG_BYTES` (a run config is a few kB: a larger file is not one, and would be parsed for
minutes), not UTF-8 text, not valid JSON or YAML, or when it gives a key twice (JSON and YAML
would keep the last value without a word: `{"lr": 0.001, "lr": 5.0}` trained at 5.0). YAML is
read with PyYAML's safe loader (no `!!python` tags), whose aliases share one object, so nested
anchors ("billion laughs") stay small.
"""

from __future__ import annotations

import json
import reprlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import yaml

MAX_CONFIG_BYTES = 1 << 20  # the largest --config file read (1 MiB)
YAML_MERGE_TAG = "tag:yaml.org,2002:merge"  # `<<: *defaults`: keys given again on purpose

# how a refusal quotes a value of the file: a few items of a few levels, so that a value
# nested without end (YAML aliases of aliases) is quoted in a line, not expanded
_QUOTE = reprlib.Repr()
_QUOTE.maxlevel, _QUOTE.maxlist, _QUOTE.maxdict = 2, 4, 4
_QUOTE.maxstring = _QUOTE.maxother = 60


def shown(value: object) -> str:
    """`repr(value)`, cut short: how a refusal quotes a value from a config file."""
    return _QUOTE.repr(value)


class DuplicateKey(ValueError):
    """A key given twice in one mapping of a config file."""

    def __init__(self, key: object, first: str, second: str):
        super().__init__(f"the key {key!r} is given twice, as {first} and {second}: keep one")


def load_config_file(path: str) -> dict[object, object]:
    """The mapping in the JSON (`.json`) or YAML (any other name) file `path`; ValueError (or
    FileNotFoundError) in one line naming the file and what is wrong."""
    file = Path(path).expanduser()
    text = _config_text(file, path)
    try:
        loaded = _parse_json(text) if file.suffix == ".json" else _parse_yaml(text)
    except DuplicateKey as error:
        raise ValueError(f"--config {path}: {error}") from None
    # json.JSONDecodeError, yaml.YAMLError, RecursionError (nested past Python's limit)
    except Exception as error:
        raise ValueError(f"--config {path} cannot be read: {_one_line(error)}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValueError(
            f"--config {path} holds a {type(loaded).__name__}; it should map flag names to "
            "values (e.g. steps: 100)"
        )
    return loaded


def _config_text(file: Path, path: str) -> str:
    """The text of the config `file` (given as `path`), within the bounds of the module doc."""
    if file.is_dir():
        raise ValueError(f"--config {path} is a folder, expected a .json/.yaml file")
    if not file.exists():
        raise FileNotFoundError(f"--config {path}: no such file")
    if not file.is_file():
        raise ValueError(f"--config {path} is not a regular file, expected a .json/.yaml file")
    with file.open("rb") as handle:  # at most one byte past the bound, however large the file
        data = handle.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ValueError(
            f"--config {path} is over {MAX_CONFIG_BYTES // 2**20} MiB, the most a run config "
            "may hold (one is a few kB): is it the right file?"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"--config {path} is not UTF-8 text (byte {data[error.start]:#04x} at offset "
            f"{error.start}), expected a .json/.yaml file"
        ) from None


def _parse_json(text: str) -> object:
    return json.loads(text, object_pairs_hook=_unique_pairs)


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object's pairs as a dict, refusing a key given twice."""
    result: dict[str, object] = {}
    for key, value in pairs:
        if key in result:
            raise DuplicateKey(key, json.dumps(result[key]), json.dumps(value))
        result[key] = value
    return result


def _parse_yaml(text: str) -> object:
    import yaml

    return yaml.load(text, Loader=_unique_key_loader())


_LOADER: type | None = None


def _unique_key_loader() -> type[yaml.SafeLoader]:
    """PyYAML's `SafeLoader`, refusing a key given twice in one mapping (made once, on first
    use, so that `import zoo.cli` does not import yaml)."""
    global _LOADER
    if _LOADER is None:
        import yaml

        class UniqueKeyLoader(yaml.SafeLoader):
            def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
                if isinstance(node, yaml.MappingNode):
                    _refuse_duplicates(self, node)
                return super().construct_mapping(node, deep=deep)

        _LOADER = UniqueKeyLoader
    return _LOADER


def _refuse_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode) -> None:
    """Refuse a key written twice in the mapping `node` (keys merged in with `<<` may be given
    again: that is what a merge is for)."""

    seen: dict[object, yaml.Node] = {}
    for key_node, value_node in node.value:
        if key_node.tag == YAML_MERGE_TAG:
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: the loader refuses it itself
            continue
        if first is not None:
            raise DuplicateKey(key, _shown(first), _shown(value_node))
        seen[key] = value_node


def _shown(node: yaml.Node) -> str:
    """A YAML value as a refusal quotes it: its text (short) and its line."""
    import yaml

    line = node.start_mark.line + 1
    if isinstance(node, yaml.ScalarNode):
        text = node.value if len(node.value) <= 40 else node.value[:37] + "..."
        return f"{text} (line {line})"
    kind = "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"
    return f"{kind} (line {line})"


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())
