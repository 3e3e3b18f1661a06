"""Partition rules: which axes split each parameter, checked on abstract meshes (no devices)."""

from __future__ import annotations

import equinox as eqx
import jax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zoo
from zoo.distributed import (
    RULES,
    abstract_mesh,
    describe,
    partition_spec,
    sharding_table,
    shardings,
)
from zoo.models.classifier import ClassifierHead
from zoo.models.gpt import LMHead
from zoo.models.translator import TranslatorHead
from zoo.nn import QKNorm


def shapes(preset, **overrides):
    return eqx.filter_eval_shape(lambda: zoo.create(preset, key=jax.random.key(0), **overrides))


CUBE = abstract_mesh("data=2,fsdp=2,tensor=2", 8)


def specs(model, mesh=CUBE):
    return {row["name"]: row["spec"] for row in sharding_table(model, mesh)}


def test_llama_parts_split_heads_and_width_over_tensor_and_rows_over_fsdp():
    table = specs(shapes("llama-tiny", **{"attention.qk_norm": QKNorm()}))
    blocks = "layers.blocks."
    assert table == {
        "embedder.token_weight": P("tensor", "fsdp"),
        # stacked [layers, out, in]: the layers axis is never split
        blocks + "self_attention.query_proj.weight": P(None, "tensor", "fsdp"),
        blocks + "self_attention.key_proj.weight": P(None, "tensor", "fsdp"),  # 2 kv heads
        blocks + "self_attention.value_proj.weight": P(None, "tensor", "fsdp"),
        blocks + "self_attention.output_proj.weight": P(None, "fsdp", "tensor"),
        blocks + "self_attention.query_norm.weight": P(),
        blocks + "self_attention.key_norm.weight": P(),
        blocks + "self_attention_norm.weight": P(None, "fsdp"),
        blocks + "feed_forward.gate.weight": P(None, "tensor", "fsdp"),
        blocks + "feed_forward.hidden.weight": P(None, "tensor", "fsdp"),
        blocks + "feed_forward.output.weight": P(None, "fsdp", "tensor"),
        blocks + "feed_forward_norm.weight": P(None, "fsdp"),
        "final_norm.weight": P("fsdp"),
    }


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [
        ("gpt-tiny", {"head": LMHead(tie=False)}),
        ("llama-tiny", {"attention.qk_norm": QKNorm()}),
        ("classifier-tiny", {"head": ClassifierHead(), "embedder.type_vocab_size": 2}),
        (
            "translator-tiny",
            {"share_embeddings": False, "head": TranslatorHead(tie=False, bias=True)},
        ),
    ],
)
def test_every_parameter_of_every_flavor_has_a_rule(preset, overrides):
    rows = sharding_table(shapes(preset, **overrides), CUBE)
    assert [row["name"] for row in rows if not row["rule"]] == []


def test_heads_and_biases_of_the_other_flavors():
    translator = specs(
        shapes("translator-tiny", share_embeddings=False, head=TranslatorHead(tie=False, bias=True))
    )
    assert translator["output_proj.weight"] == P("tensor", "fsdp")
    assert translator["output_bias"] == P("tensor")
    assert translator["decoder.blocks.cross_attention.output_proj.weight"] == P(
        None, "fsdp", "tensor"
    )
    assert translator["decoder.blocks.cross_attention.key_proj.bias"] == P(None, "tensor")
    classifier = specs(
        shapes("classifier-tiny", head=ClassifierHead(), **{"embedder.type_vocab_size": 2})
    )
    assert classifier["embedder.token_type_weight"] == P(None, "fsdp")
    assert classifier["pooler.weight"] == P(None, "fsdp")
    assert classifier["head.weight"] == P("tensor", "fsdp")  # 2 classes split over tensor=2
    assert classifier["encoder.blocks.feed_forward.output.bias"] == P(None, "fsdp")


def test_optimizer_state_follows_its_parameter():
    name = "layers.blocks.feed_forward.output.weight"
    for copy in (name, f"0.mu.{name}", f"1.0.nu.{name}"):
        assert partition_spec(copy, (2, 64, 128), CUBE) == P(None, "fsdp", "tensor")
    assert partition_spec("0.count", (), CUBE) == P()


def test_dimensions_an_axis_does_not_divide_stay_whole():
    # GPT-2's vocabulary of 50257 rows does not split in two; its width does
    assert partition_spec("embedder.token_weight", (50257, 1024), CUBE) == P(None, "fsdp")
    mesh = abstract_mesh("fsdp=8", 8)
    assert partition_spec("final_norm.weight", (12,), mesh) == P()
    assert partition_spec("head.weight", (3, 64), mesh) == P(None, "fsdp")


def test_tensor_must_divide_heads_kv_heads_and_width():
    with pytest.raises(ValueError) as raised:
        shardings(shapes("llama-tiny"), abstract_mesh("data=2,tensor=4", 8))
    assert str(raised.value) == (
        "mesh data=2,fsdp=1,tensor=4: tensor=4 must divide the model's heads, key/value heads "
        "and feed-forward width, but num_kv_heads=2 is not divisible by 4; choose tensor among "
        "[1, 2] (put the other devices on data or fsdp)"
    )
    with pytest.raises(ValueError, match="but num_heads=4, num_kv_heads=4 is not divisible by 8; "
                       "choose tensor "
                       r"among \[1, 2, 4\]"):  # fmt: skip
        sharding_table(shapes("gpt-tiny"), abstract_mesh("tensor=8", 8))
    with pytest.raises(ValueError, match="but d_ff=12 is not divisible by 8"):
        sharding_table(shapes("gpt-tiny", num_heads=8, d_ff=12), abstract_mesh("tensor=8", 8))


def test_shardings_of_model_and_optimizer_shapes_allocate_nothing():
    model = shapes("gpt-tiny")
    optimizer = zoo.train.adamw(1e-3)
    state = eqx.filter_eval_shape(
        lambda m: optimizer.init(eqx.filter(m, eqx.is_inexact_array)), model
    )
    mesh = abstract_mesh("fsdp=8", 8)
    placed = shardings(state, mesh)
    assert jax.tree_util.tree_structure(placed) == jax.tree_util.tree_structure(state)
    leaves = jax.tree_util.tree_leaves(placed)
    assert all(isinstance(leaf, NamedSharding) for leaf in leaves)
    model_shardings = shardings(model, mesh)
    assert model_shardings.final_norm.weight.spec == P("fsdp")


def test_extra_rules_go_in_front():
    lora = ((r"lora_a$", (None, "fsdp")), (r"lora_b$", ("fsdp", None)), *RULES)
    name = "layers.blocks.self_attention.query_proj.lora_a"
    assert partition_spec(name, (2, 8, 64), CUBE, lora) == P(None, None, "fsdp")
    assert partition_spec(name, (2, 8, 64), CUBE) == P()  # no rule: whole


def test_describe_gpt2_medium_under_fsdp8(capsys):
    describe(shapes("gpt2-medium"), abstract_mesh("fsdp=8", 8))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "mesh data=1,fsdp=8,tensor=1 (8 devices)"
    row = next(line for line in lines if line.startswith("layers.blocks.feed_forward.hidden.w"))
    assert row.split()[1:] == ["24x4096x1024", "(-,", "-,", "fsdp)", "50,331,648"]
    # 354,823,168 float32 parameters, an eighth each, but for the q/k/v and hidden biases
    # (fsdp splits no bias of the heads' or feed-forward's width): 7/8 x 688,128 bytes more
    assert lines[-1] == "total 1,419,292,672 bytes; 178,013,696 per device (12.5%)"
    assert 1_419_292_672 // 8 + 688_128 * 7 // 8 == 178_013_696


def test_experts_under_lora_and_int8_stay_split_by_expert():
    # the adapters and int8 scales of each expert live on the device that holds its weights
    def build():
        model = zoo.create("mixtral-tiny", key=jax.random.key(0))
        model = zoo.lora.apply(model, rank=2, targets="experts", key=jax.random.key(1))
        return zoo.lora.quantize(model)

    model = eqx.filter_eval_shape(build)
    table = {
        name.split("experts.", 1)[1]: spec
        for name, spec in specs(model, abstract_mesh("data=2,expert=4", 8)).items()
        if ".experts." in name
    }
    assert table == {
        "gate.base.weight": P(None, "expert"),
        "gate.base.scale": P(None, "expert"),
        "gate.lora_a": P(None, "expert"),
        "gate.lora_b": P(None, "expert"),
        "up.base.weight": P(None, "expert"),
        "up.base.scale": P(None, "expert"),
        "up.lora_a": P(None, "expert"),
        "up.lora_b": P(None, "expert"),
        "down.base.weight": P(None, "expert"),
        "down.base.scale": P(None, "expert"),
        "down.lora_a": P(None, "expert"),
        "down.lora_b": P(None, "expert"),
    }
