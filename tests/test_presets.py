import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest

import zoo
from zoo import presets


def test_names_include_tiny_and_published_presets():
    names = presets.names()
    for name in [
        "gpt-tiny",
        "classifier-tiny",
        "translator-tiny",
        "gpt2",
        "gpt2-medium",
        "bert-base",
        "transformer-base",
        "transformer-big",
    ]:
        assert name in names


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gpt2", 124_439_808),
        ("gpt2-medium", 354_823_168),
    ],
)
def test_published_gpt2_parameter_counts(name, expected):
    assert presets.param_count(name) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [("t5-small", 60_506_624), ("flan-t5-small", 76_961_152), ("flan-t5-base", 247_577_856)],
)
def test_t5_parameter_counts_equal_transformers(name, expected):
    # tests/interop/test_t5_parity.py derives the same numbers from transformers' own models
    assert presets.param_count(name) == expected


def test_bert_base_encoder_with_pooler_count():
    model = presets.abstract("bert-base", num_classes=2)
    head = model.head.weight.size + model.head.bias.size
    assert zoo.count_params(model) - head == 109_482_240


def test_transformer_base_is_about_65m_and_big_about_213m():
    base, big = presets.param_count("transformer-base"), presets.param_count("transformer-big")
    assert abs(base - 65e6) / 65e6 < 0.05
    assert abs(big - 213e6) / 213e6 < 0.03


@pytest.mark.parametrize("name", presets.names())
def test_every_preset_builds_abstractly_with_its_flavor(name):
    model = presets.abstract(name)
    flavor_class = {"gpt": zoo.GPT, "classifier": zoo.Classifier, "translator": zoo.Translator}
    assert isinstance(model, flavor_class[presets.get(name).flavor])
    assert zoo.count_params(model) > 0


def test_overrides_change_config_fields(key):
    clf = zoo.create("classifier-tiny", num_classes=7, key=key)
    assert clf.config.num_classes == 7 and clf.head.weight.shape == (7, 64)
    with pytest.raises(ValueError, match="no field 'num_clases'.*did you mean 'num_classes'"):
        zoo.create("classifier-tiny", num_clases=7, key=key)
    with pytest.raises(ValueError, match="AttentionSettings has no field 'num_kv_head'"):
        zoo.create("classifier-tiny", key=key, **{"attention.num_kv_head": 2})


def test_unknown_preset_lists_close_names():
    with pytest.raises(KeyError, match="Did you mean 'gpt2'"):
        presets.get("gtp2")


def _loss(flavor, model, batch):
    if flavor == "gpt":
        logits = jax.vmap(model)(batch[:, :-1])
        targets = batch[:, 1:]
    elif flavor == "translator":
        logits = jax.vmap(model)(batch, batch[:, :-1])
        targets = batch[:, 1:]
    else:
        logits = jax.vmap(model)(batch)
        targets = batch[:, 0] % 2
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), targets
    ).mean()


@pytest.mark.parametrize("name", ["gpt-tiny", "classifier-tiny", "translator-tiny"])
def test_jitted_gradient_steps_reduce_the_loss(name, key):
    flavor = presets.get(name).flavor
    model = zoo.create(name, key=key)
    optimizer = optax.adam(3e-3)
    state = optimizer.init(eqx.filter(model, eqx.is_array))
    batch = jax.random.randint(jax.random.key(1), (4, 12), 3, 64)

    @eqx.filter_jit
    def step(model, state):
        loss, grads = eqx.filter_value_and_grad(lambda m: _loss(flavor, m, batch))(model)
        # optax mixes its int32 step count with floats, which strict promotion rejects
        with jax.numpy_dtype_promotion("standard"):
            updates, state = optimizer.update(grads, state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), state, loss

    first = None
    for _ in range(5):
        model, state, loss = step(model, state)
        first = float(loss) if first is None else first
    assert float(_loss(flavor, model, batch)) < first - 0.05


def test_the_readmes_preset_table_lists_every_preset_with_its_count():
    """README.md's table under "## Presets": each row's names (split by `,` or `/`, a note in
    parentheses dropped) against its counts, one count per name."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("## Presets", 1)[1].split("\n## ", 1)[0]
    listed: dict[str, str] = {}
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    for line in rows[2:]:  # after the header and its rule
        names_cell, _, counts_cell = (cell.strip() for cell in line.strip("|").split("|"))
        names = re.split(r"\s*[,/]\s*", re.sub(r"\s*\(.*\)", "", names_cell))
        counts = counts_cell.split(" / ")
        assert len(names) == len(counts), line
        listed |= dict(zip(names, counts, strict=True))
    assert sorted(listed) == sorted(presets.names())
    assert {name: f"{presets.param_count(name):,}" for name in listed} == listed
