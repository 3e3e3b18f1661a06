"""`mesh=` on the decoding functions (a mesh, a string or a Layout) and `--mesh` on their
commands, on this one device.

Eight devices are checked in tests/distributed/forced/test_generation_on_a_mesh.py; here a
one-device mesh runs the same placement code, and the errors are checked."""

from __future__ import annotations

import string

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.cli import main
from zoo.data import CharTokenizer
from zoo.decoding.beam import take_beams
from zoo.decoding.placement import decoding_layout, place_model, place_rows
from zoo.distributed import RULES, Layout, make_mesh

ONE = make_mesh("data=1", jax.devices()[:1])
PROMPTS = np.array([[5, 6, 7], [8, 9, 0]], np.int32)


def test_a_one_device_mesh_decodes_as_no_mesh(gpt, translator):
    np.testing.assert_array_equal(
        zoo.generate(gpt, PROMPTS, max_new_tokens=4, mesh=ONE),
        zoo.generate(gpt, PROMPTS, max_new_tokens=4),
    )
    tokens, scores = zoo.decoding.beam_generate(
        gpt, PROMPTS, max_new_tokens=4, beam_size=2, mesh=ONE
    )
    expected = zoo.decoding.beam_generate(gpt, PROMPTS, max_new_tokens=4, beam_size=2)
    np.testing.assert_array_equal(tokens, expected[0])
    np.testing.assert_array_equal(scores, expected[1])
    np.testing.assert_array_equal(
        zoo.translate(translator, PROMPTS, max_len=4, mesh=ONE),
        zoo.translate(translator, PROMPTS, max_len=4),
    )


def test_classify_on_a_mesh_gives_the_same_probabilities():
    classifier = zoo.create("classifier-tiny", key=jax.random.key(4))
    alone = zoo.classify(classifier, PROMPTS)
    np.testing.assert_array_equal(zoo.classify(classifier, PROMPTS, mesh=ONE), alone)
    np.testing.assert_array_equal(
        zoo.classify(classifier, PROMPTS, mesh=Layout.of(ONE, RULES)), alone
    )


def test_a_model_already_on_the_mesh_is_not_copied(gpt):
    layout = decoding_layout(ONE)
    assert place_model(layout, gpt) is gpt  # this device is the whole one-device mesh
    assert place_model(None, gpt) is gpt
    rows, nothing = place_rows(layout, PROMPTS, None)
    assert nothing is None and rows.sharding.mesh == ONE


def test_a_layout_carries_the_rules(gpt, translator):
    rules = ((r"lm_head", (None, None)), *RULES)  # any rule table: one device splits nothing
    layout = Layout.of(ONE, rules)
    alone = zoo.generate(gpt, PROMPTS, max_new_tokens=4)
    np.testing.assert_array_equal(zoo.generate(gpt, PROMPTS, max_new_tokens=4, mesh=layout), alone)
    np.testing.assert_array_equal(
        zoo.translate(translator, PROMPTS, max_len=4, mesh=layout),
        zoo.translate(translator, PROMPTS, max_len=4),
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda gpt, translator: zoo.generate(gpt, PROMPTS, max_new_tokens=2, mesh=ONE, rules=RULES),
        lambda gpt, translator: zoo.decoding.beam_generate(
            gpt, PROMPTS, max_new_tokens=2, beam_size=2, mesh=ONE, rules=RULES
        ),
        lambda gpt, translator: zoo.translate(translator, PROMPTS, max_len=4, rules=RULES),
        lambda gpt, translator: zoo.decoding.beam_translate(
            translator, PROMPTS, max_len=4, beam_size=2, rules=RULES
        ),
        lambda gpt, translator: zoo.classify(
            zoo.create("classifier-tiny", key=jax.random.key(4)), PROMPTS, rules=RULES
        ),
    ],
)
def test_rules_beside_the_mesh_are_refused(gpt, translator, call):
    """The rules travel in the `Layout` (`mesh=Layout.of(mesh, rules)`); `rules=` is no
    keyword of the decoding calls."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'rules'"):
        call(gpt, translator)


def test_a_mesh_that_does_not_fit_is_refused(gpt):
    with pytest.raises(ValueError, match="needs 2 devices but there are 1 cpu devices"):
        zoo.generate(gpt, PROMPTS, max_new_tokens=2, mesh="data=2")


def test_take_beams_reorders_the_beams_of_each_source_among_themselves():
    rows = jnp.arange(6) * 10  # 2 sources x 3 beams
    parents = jnp.array([[2, 0, 0], [1, 2, 1]], jnp.int32)
    np.testing.assert_array_equal(take_beams(rows, parents), [20, 0, 0, 40, 50, 40])
    columns = jnp.stack([rows, rows + 1])  # the rows on axis 1
    np.testing.assert_array_equal(
        take_beams(columns, parents, row_axes=1), [[20, 0, 0, 40, 50, 40], [21, 1, 1, 41, 51, 41]]
    )


def test_the_commands_take_mesh(tmp_path, capsys):
    tokenizer = CharTokenizer(string.ascii_lowercase + " ")
    gpt = zoo.create("gpt-tiny", key=jax.random.key(3), vocab_size=tokenizer.vocab_size)
    zoo.save(gpt, tmp_path, tokenizer=tokenizer)
    command = ["generate", str(tmp_path), "--prompt", "ab", "--max-new-tokens", "3"]
    assert main(command) == 0
    alone = capsys.readouterr().out
    assert main([*command, "--mesh", "data=1"]) == 0
    assert capsys.readouterr().out == alone
    assert main([*command, "--mesh", "data=2"]) == 2
    assert capsys.readouterr().err == (
        "zoo generate: error: mesh 'data=2' needs 2 devices but there are 1 cpu devices; make "
        "the sizes multiply to 1, or give one axis -1 to take the rest (e.g. data=2,fsdp=-1)\n"
    )
    for name in ("translate", "classify"):
        assert main([name, str(tmp_path), "ab", "--mesh", "tensor=3"]) == 2
        assert "needs 3 devices but there are 1 cpu devices" in capsys.readouterr().err
