"""Records as trees: a field by its dotted path, copies with fields changed (all at once, JSON
data made into the declared types), and the JSON form with the record's class where a field may
hold several."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, is_dataclass

import pytest

from zoo import presets
from zoo.records import (
    FrozenMap,
    field_types,
    from_data,
    get_path,
    replace_path,
    replace_paths,
    to_data,
    type_at,
)


@dataclass(frozen=True, kw_only=True)
class Leaf:
    size: int = 1
    rate: float = 0.5
    sizes: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Other:
    name: str = "other"


@dataclass(frozen=True, kw_only=True)
class Pair:
    low: int = 0
    high: int = 1

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"low={self.low} exceeds high={self.high}")


@dataclass(frozen=True, kw_only=True)
class Root:
    leaf: Leaf = field(default_factory=Leaf)
    either: Leaf | Other = field(default_factory=Other)
    maybe: Pair | None = None
    pair: Pair = field(default_factory=Pair)


def test_a_field_by_its_path():
    root = Root()
    assert get_path(root, "leaf.rate") == 0.5
    with pytest.raises(
        ValueError, match=r"Leaf has no field 'rat' \(in leaf\); did you mean 'rate'"
    ):
        get_path(root, "leaf.rat")
    assert type_at(Root, "leaf.sizes") == tuple[int, ...]


def test_a_copy_with_a_field_changed_rebuilds_each_record_on_the_way():
    root = Root()
    changed = replace_path(root, "leaf.size", 3)
    assert changed.leaf.size == 3 and root.leaf.size == 1 and changed.either is root.either
    assert replace_path(root, "leaf.sizes", [1, 2]).leaf.sizes == (1, 2)  # JSON list -> tuple
    assert replace_path(root, "maybe", {"low": 2, "high": 5}).maybe == Pair(low=2, high=5)
    with pytest.raises(ValueError, match="maybe is None, so low cannot be set inside it"):
        replace_path(root, "maybe.low", 1)
    with pytest.raises(ValueError, match="size=True is a bool; size takes a number"):
        replace_path(root, "leaf.size", True)


def test_changes_to_one_record_are_made_together():
    """low=5 alone exceeds high=1; with high=9 in the same call the record is valid."""
    with pytest.raises(ValueError, match="low=5 exceeds high=1"):
        replace_path(Root(), "pair.low", 5)
    both = replace_paths(Root(), {"pair.low": 5, "pair.high": 9})
    assert both.pair == Pair(low=5, high=9)


def test_a_field_of_several_record_classes_names_the_class_in_its_json_form():
    root = Root(either=Leaf(size=4), maybe=Pair(low=1, high=2))
    data = to_data(root)
    assert data["either"] == {"type": "Leaf", "size": 4, "rate": 0.5, "sizes": []}
    assert data["maybe"] == {"low": 1, "high": 2}  # one class: no name needed
    assert from_data(Root, json.loads(json.dumps(data))) == root
    with pytest.raises(ValueError, match=r"either needs 'type': one of \['Leaf', 'Other'\]"):
        from_data(Root, {"either": {"size": 4}})
    with pytest.raises(ValueError, match="Root has no field 'leef'; did you mean 'leaf'"):
        from_data(Root, {"leef": {}})


def test_a_frozen_map_is_a_mapping_that_hashes():
    changes = FrozenMap({"a.b": 1, "c": None})
    assert dict(changes) == {"a.b": 1, "c": None} and changes == {"c": None, "a.b": 1}
    assert hash(changes) == hash(FrozenMap([("a.b", 1), ("c", None)]))
    with pytest.raises(ValueError, match="a key is given twice"):
        FrozenMap([("a", 1), ("a", 2)])


@dataclass(frozen=True, kw_only=True)
class Bounded:
    rate: float = 0.5  # checked: in [0, 1)
    scale: float = 1.0  # not checked

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate < 1.0:
            raise ValueError(f"rate must be in [0, 1), got {self.rate}")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_number_is_refused_with_the_fields_range(bad):
    with pytest.raises(
        ValueError, match=rf"rate={bad} is not a finite number \(rate must be in \[0, 1\)\)$"
    ):
        replace_path(Bounded(), "rate", bad)
    # a field whose record checks nothing (inf passed every `>=` test) is refused all the same
    with pytest.raises(ValueError, match=rf"scale={bad} is not a finite number; scale takes a"):
        replace_path(Bounded(), "scale", bad)
    with pytest.raises(ValueError, match=rf"rate={bad} is not a finite number \(rate must be"):
        from_data(Bounded, {"rate": bad})  # a config file read back
    with pytest.raises(ValueError, match="sizes takes finite numbers"):
        replace_path(Root(), "leaf.sizes", [1.0, bad])
    with pytest.raises(ValueError, match="rate='nan' is text; rate takes a number"):
        replace_path(Root(), "leaf.rate", "nan")  # never a TypeError from `<` inside the record


def float_fields(record: object, prefix: str = "") -> list[str]:
    """The dotted path of every float field of the record tree `record`."""
    paths = []
    for name, hint in field_types(type(record)).items():
        value = getattr(record, name)
        if is_dataclass(value) and not isinstance(value, type):
            paths += float_fields(value, f"{prefix}{name}.")
        elif "float" in str(hint):
            paths.append(prefix + name)
    return paths


@pytest.mark.parametrize("preset", ["mixtral-tiny", "gemma-3-tiny", "classifier-tiny",
                                    "translator-tiny", "phi-3-tiny"])  # fmt: skip
def test_every_float_field_of_a_models_config_refuses_nan_and_infinities(preset):
    config = presets.get(preset).config
    paths = float_fields(config)
    assert "init_std" in paths and "layers.block.norm.eps" in paths
    for path in paths:
        for bad in (math.nan, math.inf, -math.inf):
            with pytest.raises(ValueError, match=f"={bad} is not a finite number"):
                config.replace(**{path: bad})
