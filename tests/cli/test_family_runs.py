"""Each decoder family's user path on the command line: a tiny hub-shaped folder written by
transformers' `save_pretrained` exported again with `zoo export FOLDER --hf OUT`, and (Phi, whose
LongRoPE switches factors past its original context) `zoo train gpt --init FOLDER` then
`zoo export RUN --hf OUT`, and (SmolLM3, OLMo 3) `zoo train gpt --preset X-tiny` then the same
export; transformers loads OUT as the family's class and gives zoo's logits.
The tiny presets' parameter counts equal transformers' for the same shapes."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import zoo
from tests.cli.conftest import write_jsonl
from zoo.cli import main

pytestmark = [pytest.mark.hf, pytest.mark.slow]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

FAMILIES = {
    "gemma-3-tiny": "Gemma3ForCausalLM",
    "gemma-2-tiny": "Gemma2ForCausalLM",
    "phi-3-tiny": "Phi3ForCausalLM",
    "olmo-2-tiny": "Olmo2ForCausalLM",
    "olmo3-tiny": "Olmo3ForCausalLM",
    "smollm3-tiny": "SmolLM3ForCausalLM",
}
CHATS = [
    [{"role": "user", "content": "Hello, how are you?"},
     {"role": "assistant", "content": "I'm doing great, thank you!"}],
    [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "It is 4."}],
]  # fmt: skip


def hub_folder(preset: str, folder, tokenizer):
    """The preset's shapes as transformers writes a checkpoint: random weights, tokenizer."""
    from zoo.interop import save_hf

    model = zoo.create(preset, key=jax.random.key(1), vocab_size=tokenizer.vocab_size,
                       pad_id=tokenizer.pad_id, bos_id=None, eos_id=tokenizer.eos_id)  # fmt: skip
    save_hf(model, folder / "zoo-written", tokenizer=tokenizer)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder / "zoo-written"))
    hf.save_pretrained(folder / "hub")
    transformers.AutoTokenizer.from_pretrained(str(folder / "zoo-written")).save_pretrained(
        folder / "hub"
    )
    return folder / "hub"


def logits_agree(model, out) -> None:
    """transformers' model in `out` gives `model`'s logits on 40 tokens."""
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, size=40)
    ids[ids == model.config.pad_id] = 1  # zoo reads the pad id as padding; transformers does not
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf(torch.tensor(ids[None])).logits[0].numpy()
    ours = np.asarray(model(jax.numpy.asarray(ids, dtype=jax.numpy.int32)))
    assert np.abs(theirs).max() > 0.1
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tests.data.chat_folders import qwen25_folder
    from zoo.interop import pretrained_tokenizer

    return pretrained_tokenizer(qwen25_folder(tmp_path_factory.mktemp("tokenizer")))


@pytest.mark.parametrize("preset", list(FAMILIES))
def test_a_hub_folder_exports_to_its_family(preset, tokenizer, tmp_path, capsys):
    start = hub_folder(preset, tmp_path, tokenizer)
    out = tmp_path / "out"
    assert main(["export", str(start), "--hf", str(out)]) == 0
    assert f"wrote {FAMILIES[preset]}" in capsys.readouterr().out
    logits_agree(zoo.from_pretrained(start), out)


def test_init_train_export_gives_transformers_the_runs_logits(tokenizer, tmp_path, capsys):
    from zoo.serialize import load_with_tokenizer

    start = hub_folder("phi-3-tiny", tmp_path, tokenizer)
    write_jsonl(tmp_path / "chats", "train", [{"messages": chat} for chat in CHATS * 2])
    run, out = tmp_path / "run", tmp_path / "out"
    train = ["train", "gpt", "--init", str(start), "--data", f"json:{tmp_path / 'chats'}",
             "--steps", "2", "--batch-size", "2", "--max-len", "127", "--lr", "1e-2",
             "--out", str(run), "--no-progress", "--json"]  # fmt: skip
    assert main(train) == 0
    assert main(["export", str(run), "--hf", str(out)]) == 0
    capsys.readouterr()
    model, _ = load_with_tokenizer(run)
    assert not np.allclose(model.head.weight, zoo.from_pretrained(start).head.weight)  # trained
    logits_agree(model, out)


@pytest.mark.parametrize("preset", ["smollm3-tiny", "olmo3-tiny"])
def test_a_tiny_preset_trains_and_exports_to_its_family(preset, tmp_path, capsys):
    run, out = tmp_path / "run", tmp_path / "out"
    train = ["train", "gpt", "--preset", preset, "--data", "synthetic:addition", "--steps", "2",
             "--batch-size", "4", "--out", str(run), "--no-progress", "--json"]  # fmt: skip
    assert main(train) == 0
    assert main(["export", str(run), "--hf", str(out), "--no-tokenizer"]) == 0
    assert f"wrote {FAMILIES[preset]}" in capsys.readouterr().out
    logits_agree(zoo.load(run), out)


@pytest.mark.parametrize("preset", list(FAMILIES))
def test_tiny_preset_counts_equal_transformers(preset):
    from zoo.interop.architectures import architecture_for

    config = zoo.presets.config(preset)
    arch = architecture_for(config)
    fields = {k: v for k, v in arch.hf_config(config).items() if k != "model_type"}
    with torch.device("meta"):
        hf = getattr(transformers, FAMILIES[preset])(
            getattr(transformers, arch.config_class)(**fields)
        )
    assert hf.num_parameters() == zoo.presets.param_count(preset)
