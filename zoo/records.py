"""Settings records as trees: dotted paths into them, and their JSON form.

A model's config is a tree of frozen dataclasses (its parts' settings records). Here, for any
such tree:

- `get_path(record, "layers.block.attention.num_heads")` reads a field by its dotted path;
- `replace_path(record, path, value)` returns a copy with that one field changed (every record
  on the way is rebuilt, so each checks its new value in its `__post_init__`); a value given
  as JSON data (a dict for a record, a list for a tuple) becomes the field's declared type;
- `to_data(record)` / `from_data(cls, data)` write and read the JSON form: a dict per record,
  lists for tuples, and a `"type"` key naming the record's class where the field may hold
  records of several classes (`FeedForwardSettings | MoESettings`).

A record class may define `to_data(self)` and a classmethod `from_data(cls, data)` of its own;
both functions use them.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar, Union

# What a record holds and what its JSON form is made of.
JSONData = object


if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    R = TypeVar("R", bound=DataclassInstance)  # a record: a dataclass instance
else:
    R = TypeVar("R")

TYPE_KEY = "type"  # the key naming a record's class in its JSON form


class FrozenMap(Mapping[str, object]):
    """A read-only mapping that hashes, for records held as static fields of a module."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, object] | Sequence[tuple[str, object]] = ()):
        pairs = items.items() if isinstance(items, Mapping) else items
        self._items: tuple[tuple[str, object], ...] = tuple(pairs)
        if len({key for key, _ in self._items}) != len(self._items):
            raise ValueError(f"a key is given twice in {[key for key, _ in self._items]}")

    def __getitem__(self, key: str) -> object:
        for name, value in self._items:
            if name == key:
                return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self._items) == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"{{{', '.join(f'{key!r}: {value!r}' for key, value in self._items)}}}"


_FIELD_TYPES: dict[type, dict[str, object]] = {}


def field_types(cls: type) -> dict[str, object]:
    """The declared type of each field of the record class `cls`, resolved (once per class)."""
    if cls not in _FIELD_TYPES:
        hints = typing.get_type_hints(cls)
        _FIELD_TYPES[cls] = {field.name: hints[field.name] for field in dataclasses.fields(cls)}
    return _FIELD_TYPES[cls]


def _fields_of(record: object, path: str) -> dict[str, object]:
    if not dataclasses.is_dataclass(record) or isinstance(record, type):
        raise ValueError(f"{path or 'the value'} is not a settings record: it has no fields")
    return field_types(type(record))


def _unknown(name: str, cls: type, where: str) -> ValueError:
    valid = [field.name for field in dataclasses.fields(cls)]
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ValueError(
        f"{cls.__name__} has no field {name!r}{where}{hint} (its fields: {', '.join(valid)})"
    )


def get_path(record: object, path: str) -> object:
    """The value at the dotted `path` of `record` (`"attention.num_heads"`)."""
    value: object = record
    walked: list[str] = []
    for name in path.split("."):
        fields = _fields_of(value, ".".join(walked))
        if name not in fields:
            where = f" (in {'.'.join(walked)})" if walked else ""
            raise _unknown(name, type(value), where)
        value = getattr(value, name)
        walked.append(name)
    return value


def replace_path(record: R, path: str, value: object) -> R:
    """A copy of `record` with the field at the dotted `path` set to `value`.

    JSON data becomes the declared type (a dict a record, a list a tuple); a bool where a
    number is declared is refused (Python counts `True` as 1)."""
    return replace_paths(record, {path: value})


def replace_paths(record: R, changes: Mapping[str, object]) -> R:
    """A copy of `record` with every field at the dotted paths of `changes` set at once: each
    record on the way is rebuilt once, with all of its changes, so checks across fields see
    the new values together (`num_heads` and `num_kv_heads` changed in either order)."""
    changed = _replaced(record, changes)
    assert isinstance(changed, type(record))
    return changed


def _replaced(record: object, changes: Mapping[str, object]) -> object:
    fields = _fields_of(record, "")
    nested: dict[str, dict[str, object]] = {}
    direct: dict[str, object] = {}
    for path, value in changes.items():
        name, _, rest = path.partition(".")
        if name not in fields:
            raise _unknown(name, type(record), "")
        if rest:
            nested.setdefault(name, {})[rest] = value
        else:
            direct[name] = field_value(record, name, fields[name], value)
    for name, inner_changes in nested.items():
        inner = direct.get(name, getattr(record, name))
        if inner is None:
            first = next(iter(inner_changes))
            raise ValueError(
                f"{name} is None, so {first} cannot be set inside it: set {name} itself "
                f"(e.g. {name}={{...}})"
            )
        direct[name] = _replaced(inner, inner_changes)
    assert dataclasses.is_dataclass(record) and not isinstance(record, type)
    return dataclasses.replace(record, **direct)


def _union_members(hint: object) -> tuple[object, ...]:
    if typing.get_origin(hint) in (Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _record_classes(hint: object) -> list[type]:
    """The record classes a field of type `hint` may hold."""
    return [
        member
        for member in _union_members(hint)
        if isinstance(member, type) and dataclasses.is_dataclass(member)
    ]


def _admits_bool(hint: object) -> bool:
    return any(
        member in (bool, object) or typing.get_origin(member) is not None
        for member in _union_members(hint)
    )


def _is_number_field(hint: object) -> bool:
    return any(member in (int, float) for member in _union_members(hint))


def _admits_text(hint: object) -> bool:
    return any(
        member in (str, object) or typing.get_origin(member) is not None
        for member in _union_members(hint)
    )


def coerce(hint: object, value: object, name: str = "the value") -> object:
    """`value` as a field declared `hint` holds it: JSON data made into records and tuples."""
    if value is None:
        return None
    if isinstance(value, bool) and _is_number_field(hint) and not _admits_bool(hint):
        raise ValueError(f"{name}={value!r} is a bool; {name} takes a number")
    if isinstance(value, str) and _is_number_field(hint) and not _admits_text(hint):
        raise ValueError(f"{name}={value!r} is text; {name} takes a number")
    classes = _record_classes(hint)
    if isinstance(value, Mapping) and not isinstance(value, FrozenMap) and classes:
        return _record_from(classes, value, name)
    if isinstance(value, list | tuple):
        element = _element_type(hint)
        return tuple(coerce(element, item, name) for item in value)
    return value


def field_value(record: object, name: str, hint: object, value: object) -> object:
    """`value` for the field `name` (declared `hint`) of `record` (or of a new record, given
    its class), as `coerce` makes it; NaN or an infinity in a number field is refused naming
    the field's range.

    NaN passes every `<` test a record's check makes, and an infinity passes `>= 0`: a
    `router aux_loss_coef` of inf trained to a NaN loss."""
    coerced = coerce(hint, value, name)
    numbers = coerced if isinstance(coerced, tuple) else (coerced,)
    bad = next((n for n in numbers if isinstance(n, float) and not math.isfinite(n)), None)
    if bad is None or not (_is_number_field(hint) or _is_number_field(_element_type(hint))):
        return coerced
    many = isinstance(coerced, tuple)
    allowed = "" if many else _range_of(record, name)
    reason = f" ({allowed})" if allowed else f"; {name} takes finite numbers" if many else ""
    reason = reason or f"; {name} takes a finite number"
    raise ValueError(f"{name}={value} is not a finite number{reason}")


def _range_of(record: object, name: str) -> str:
    """What `record` (a record or its class) allows in its field `name`, as its own check says
    when the field is NaN (its message up to ", got"); "" when it does not refuse NaN."""
    try:
        if isinstance(record, type):
            record(**{name: math.nan})
        else:
            dataclasses.replace(record, **{name: math.nan})  # type: ignore[type-var]
    except ValueError as error:
        return re.sub(r",? got .*$", "", str(error), flags=re.DOTALL).strip()
    except Exception:  # a record that cannot be made from its defaults: no range to quote
        return ""
    return ""


def _element_type(hint: object) -> object:
    """The declared type of a tuple field's items (`tuple[int, ...]`, `Sequence[float]`)."""
    for member in _union_members(hint):
        args = typing.get_args(member)
        if typing.get_origin(member) in (tuple, Sequence) and args:
            return args[0]
    return object


def _record_from(classes: list[type], data: Mapping[str, object], name: str) -> object:
    if len(classes) == 1 and TYPE_KEY not in data:
        return from_data(classes[0], data)
    kind = data.get(TYPE_KEY)
    for cls in classes:
        if cls.__name__ == kind:
            return from_data(cls, {k: v for k, v in data.items() if k != TYPE_KEY})
    names = [cls.__name__ for cls in classes]
    raise ValueError(f"{name} needs {TYPE_KEY!r}: one of {names}, got {kind!r}")


def from_data(cls: type[R], data: Mapping[str, object]) -> R:
    """The record of class `cls` that `data` (its JSON form, `to_data`) describes."""
    custom = cls.__dict__.get("from_data")
    if isinstance(custom, classmethod):
        return custom.__get__(None, cls)(data)
    if not isinstance(data, Mapping):
        raise ValueError(f"{cls.__name__} is written as a JSON object, got {data!r}")
    fields = field_types(cls)
    for name in data:
        if name not in fields:
            raise _unknown(name, cls, "")
    return cls(
        **{name: field_value(cls, name, fields[name], value) for name, value in data.items()}
    )


def to_data(record: object) -> dict[str, JSONData]:
    """The JSON form of `record`: a dict per record, lists for tuples, `"type"` where a field
    may hold records of several classes."""
    custom = type(record).__dict__.get("to_data")
    if callable(custom):
        result = custom(record)
        assert isinstance(result, dict)
        return result
    fields = _fields_of(record, "")
    return {name: encode(hint, getattr(record, name)) for name, hint in fields.items()}


def encode(hint: object, value: object) -> JSONData:
    """One field's value in JSON form (`to_data` of a record, a list for a tuple)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        data = to_data(value)
        if len(_record_classes(hint)) != 1:
            return {TYPE_KEY: type(value).__name__, **data}
        return data
    if isinstance(value, tuple | list):
        element = _element_type(hint)
        return [encode(element, item) for item in value]
    if isinstance(value, FrozenMap):
        return {key: encode(object, item) for key, item in value.items()}
    return value


def type_at(cls: type, path: str) -> object:
    """The declared type of the field at the dotted `path` of records of class `cls` (through
    fields that hold one record class each, or None)."""
    hint: object = cls
    walked: list[str] = []
    for name in path.split("."):
        classes = _record_classes(hint)
        if len(classes) != 1:
            inside = ".".join(walked) or cls.__name__
            raise ValueError(f"{inside} is not one kind of record, so {path} has no one type")
        fields = field_types(classes[0])
        if name not in fields:
            where = f" (in {'.'.join(walked)})" if walked else ""
            raise _unknown(name, classes[0], where)
        hint = fields[name]
        walked.append(name)
    return hint
