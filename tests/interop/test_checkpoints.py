"""The conversion engine and checkpoint files, without torch: random HF-layout checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from hub_stub import stub_hub

import zoo
from zoo.interop import (
    CheckpointMismatch,
    UnsupportedConfig,
    UnsupportedExport,
    from_pretrained,
    save_hf,
)
from zoo.interop.architecture import HFConfig, activation_dropout
from zoo.interop.architectures import architecture_of
from zoo.interop.convert import expected_hf_shapes
from zoo.interop.weights import read_safetensors, read_weights, write_safetensors
from zoo.interop.zoo_keys import abstract_model, zoo_shapes
from zoo.presets import build
from zoo.records import get_path

CONFIGS = {
    "gpt2-tied": dict(
        model_type="gpt2", vocab_size=29, n_positions=12, n_embd=8, n_head=2, n_layer=2
    ),
    "gpt2-untied": dict(
        model_type="gpt2",
        vocab_size=29,
        n_positions=12,
        n_embd=12,
        n_head=3,
        n_layer=1,
        n_inner=20,
        tie_word_embeddings=False,
    ),
    "bert": dict(
        model_type="bert",
        vocab_size=31,
        hidden_size=8,
        num_attention_heads=2,
        num_hidden_layers=2,
        intermediate_size=12,
        max_position_embeddings=10,
        id2label={"0": "neg", "1": "pos", "2": "mixed"},
    ),
    "marian-shared": dict(
        model_type="marian",
        vocab_size=23,
        d_model=8,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_layers=2,
        decoder_layers=1,
        encoder_ffn_dim=12,
        decoder_ffn_dim=12,
        max_position_embeddings=10,
        pad_token_id=22,
        decoder_start_token_id=22,
        eos_token_id=0,
    ),
    "marian-separate": dict(
        model_type="marian",
        vocab_size=23,
        decoder_vocab_size=19,
        share_encoder_decoder_embeddings=False,
        d_model=8,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_layers=1,
        decoder_layers=2,
        encoder_ffn_dim=12,
        decoder_ffn_dim=12,
        max_position_embeddings=10,
        pad_token_id=18,
        decoder_start_token_id=18,
        eos_token_id=0,
        scale_embedding=True,
    ),
}


def random_checkpoint(folder, config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Write config.json and a model.safetensors of random arrays with the shapes `config` implies."""
    arch = architecture_of(config)
    present = {"bert.pooler.dense.weight": ()}  # BERT: a pooler, as a full checkpoint has
    fields = arch.zoo_fields(HFConfig(config, arch.hf_defaults(), arch.name), present)
    zoo_config = arch.zoo_config(fields)
    skeleton = abstract_model(lambda: build(zoo_config, key=jax.random.key(0)))
    key_map = arch.key_map(zoo_config)
    shapes = expected_hf_shapes(key_map, zoo_shapes(skeleton))
    rng = np.random.default_rng(seed)
    primary = {key for r in key_map.rules for key in r.hf}
    arrays = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items() if k in primary}
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(arrays, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config))
    return arrays


@pytest.mark.parametrize("name", list(CONFIGS))
def test_checkpoint_round_trips_through_zoo_exactly(tmp_path, name):
    arrays = random_checkpoint(tmp_path / "in", CONFIGS[name])
    model = from_pretrained(tmp_path / "in")
    save_hf(model, tmp_path / "out")
    written = read_weights(tmp_path / "out")
    assert set(written) == set(arrays)
    for key, array in arrays.items():
        assert np.array_equal(written[key], array), key
    assert from_pretrained(tmp_path / "out").config == model.config


def test_stacked_layers_take_each_layer_from_its_own_keys(tmp_path):
    arrays = random_checkpoint(tmp_path, CONFIGS["gpt2-tied"])
    model = from_pretrained(tmp_path)
    fused = arrays["transformer.h.1.attn.c_attn.weight"]  # Conv1D [in, 3 * out]
    value = model.layers.layer(1).self_attention.value_proj.weight
    assert np.array_equal(value, fused[:, 16:].T)
    assert np.array_equal(model.embedder.position_weight, arrays["transformer.wpe.weight"])


def test_a_missing_key_is_named(tmp_path):
    arrays = random_checkpoint(tmp_path, CONFIGS["gpt2-tied"])
    del arrays["transformer.h.1.mlp.c_fc.bias"]
    write_safetensors(arrays, tmp_path / "model.safetensors")
    with pytest.raises(
        CheckpointMismatch, match=r"missing keys: transformer\.h\.1\.mlp\.c_fc\.bias"
    ):
        from_pretrained(tmp_path)


def test_a_misshapen_key_is_named_with_both_shapes(tmp_path):
    arrays = random_checkpoint(tmp_path, CONFIGS["bert"])
    arrays["bert.encoder.layer.0.intermediate.dense.weight"] = np.zeros((13, 8), np.float32)
    write_safetensors(arrays, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointMismatch) as error:
        from_pretrained(tmp_path)
    message = str(error.value)
    assert "bert.encoder.layer.0.intermediate.dense.weight" in message
    assert "(13, 8)" in message and "(12, 8)" in message


def test_an_unexpected_key_is_named(tmp_path):
    arrays = random_checkpoint(tmp_path, CONFIGS["marian-shared"])
    arrays["model.encoder.layernorm_embedding.weight"] = np.ones(8, np.float32)
    write_safetensors(arrays, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointMismatch, match=r"unexpected keys: model\.encoder\.layernorm_emb"):
        from_pretrained(tmp_path)


def test_sharded_checkpoints_load(tmp_path):
    arrays = random_checkpoint(tmp_path / "single", CONFIGS["bert"])
    keys = sorted(arrays)
    shards = {
        "model-00001-of-00002.safetensors": keys[:20],
        "model-00002-of-00002.safetensors": keys[20:],
    }
    folder = tmp_path / "sharded"
    folder.mkdir()
    for file, names in shards.items():
        write_safetensors({k: arrays[k] for k in names}, folder / file)
    index = {"weight_map": {k: file for file, names in shards.items() for k in names}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "config.json").write_text(json.dumps(CONFIGS["bert"]))
    sharded, single = from_pretrained(folder), from_pretrained(tmp_path / "single")
    for ours, theirs in zip(jax.tree.leaves(sharded), jax.tree.leaves(single)):
        assert np.array_equal(ours, theirs)


def test_bfloat16_weights_are_written_and_read(tmp_path):
    random_checkpoint(tmp_path / "in", CONFIGS["gpt2-untied"])
    model = from_pretrained(tmp_path / "in", dtype="bfloat16")
    assert model.embedder.token_weight.dtype == jax.numpy.bfloat16
    save_hf(model, tmp_path / "out")
    header_size = int.from_bytes((tmp_path / "out/model.safetensors").read_bytes()[:8], "little")
    header = json.loads((tmp_path / "out/model.safetensors").read_bytes()[8 : 8 + header_size])
    assert header["transformer.wte.weight"]["dtype"] == "BF16"
    assert header["__metadata__"] == {"format": "pt"}
    again = read_safetensors(tmp_path / "out/model.safetensors")
    assert np.array_equal(again["lm_head.weight"], np.asarray(model.head.weight))


def test_a_folder_without_weights_names_the_files_it_looks_for(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS["bert"]))
    (tmp_path / "tf_model.h5").write_bytes(b"not read")
    with pytest.raises(FileNotFoundError, match="has none of model.safetensors") as error:
        from_pretrained(tmp_path)
    assert "pytorch_model.bin.index.json" in str(error.value)


@pytest.mark.parametrize(
    ("file", "cut"),
    [
        ("model.safetensors", 0),
        ("model.safetensors", 0.5),
        ("config.json", 0),
        ("config.json", 0.5),
    ],
    ids=["empty-weights", "truncated-weights", "empty-config", "truncated-config"],
)
def test_a_damaged_file_is_named_with_what_to_do(tmp_path, file, cut):
    random_checkpoint(tmp_path, CONFIGS["gpt2-tied"])
    data = (tmp_path / file).read_bytes()
    (tmp_path / file).write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(ValueError, match="download it again") as error:
        from_pretrained(tmp_path)
    assert f"{tmp_path / file} is damaged" in str(error.value)


def test_a_missing_shard_is_named(tmp_path):
    random_checkpoint(tmp_path, CONFIGS["gpt2-tied"])
    (tmp_path / "model.safetensors").rename(tmp_path / "model-00001-of-00002.safetensors")
    index = {
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
        }
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="lists the shard model-00002-of-00002.safetensors"):
        from_pretrained(tmp_path)


def test_a_safetensors_repository_downloads_no_pickles(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    arrays = random_checkpoint(repo, CONFIGS["marian-shared"])
    for name in ("pytorch_model.bin", "tf_model.h5", "README.md", "source.spm"):
        (repo / name).write_bytes(b"not weights")
    downloaded = stub_hub(monkeypatch, repo, tmp_path / "cache")
    model = from_pretrained("Helsinki-NLP/opus-mt-de-en")
    assert sorted(downloaded) == ["config.json", "model.safetensors"]
    assert np.array_equal(model.output_bias, arrays["final_logits_bias"][0])


def test_a_repository_without_safetensors_or_pickles_is_refused(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "config.json").write_text(json.dumps(CONFIGS["bert"]))
    (repo / "tf_model.h5").write_bytes(b"not read")
    downloaded = stub_hub(monkeypatch, repo, tmp_path / "cache")
    with pytest.raises(FileNotFoundError, match=r"only tf_model\.h5, which zoo does not read"):
        from_pretrained("someone/tf-only")
    assert downloaded == []


def offline_hub(monkeypatch, cached=None):
    """The hub unreachable; `snapshot_download(local_files_only=True)` finds `cached` (if any)."""
    huggingface_hub = pytest.importorskip("huggingface_hub")

    def list_repo_files(*args, **kwargs):
        raise ConnectionError("no network")

    def snapshot_download(*args, local_files_only=False, **kwargs):
        if local_files_only and cached is not None:
            return str(cached)
        raise ConnectionError("no network")

    monkeypatch.setattr(huggingface_hub, "list_repo_files", list_repo_files)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)


def test_an_unreachable_hub_name_says_to_download_and_pass_the_folder(monkeypatch):
    offline_hub(monkeypatch)
    with pytest.raises(OSError, match="pass its path") as error:
        from_pretrained("Helsinki-NLP/opus-mt-de-en")
    message = str(error.value)
    assert "`hf download Helsinki-NLP/opus-mt-de-en --include '*.json' --include" in message
    assert "--include '*.bin' instead of '*.safetensors'" in message
    assert "huggingface-cli" not in message


def test_offline_a_cached_snapshot_is_used(tmp_path, monkeypatch):
    random_checkpoint(tmp_path, CONFIGS["gpt2-tied"])
    offline_hub(monkeypatch, cached=tmp_path)
    assert from_pretrained("gpt2").config.vocab_size == 29


def test_unknown_model_types_are_refused():
    with pytest.raises(UnsupportedConfig, match="model_type='falcon'"):
        zoo.interop.load_state_dict({"model_type": "falcon"}, {})


def test_export_refuses_models_gpt2_cannot_express():
    model = zoo.presets.abstract(
        "gpt-tiny", **{"norm_first": False, "embedder.positions": "sinusoidal"}
    )
    with pytest.raises(UnsupportedExport, match="norm_first=False") as error:
        zoo.interop.to_state_dict(model)
    assert "positions='sinusoidal'" in str(error.value)


@pytest.mark.parametrize(
    ("name", "extra", "rate"),
    [
        ("gpt2-tied", {}, 0.0),
        ("bert", {}, 0.0),
        ("marian-shared", {"activation_dropout": 0.05}, 0.05),
    ],
)
def test_dropout_on_the_feed_forward_hidden_follows_the_checkpoint(tmp_path, name, extra, rate):
    random_checkpoint(tmp_path, {**CONFIGS[name], "dropout": 0.2, **extra})
    model = from_pretrained(tmp_path)
    stack = model.layers if name.startswith("gpt2") else model.encoder
    assert activation_dropout(model.config) == rate
    assert stack.blocks.feed_forward.dropout.rate == rate


def test_loading_and_saving_a_folder_never_imports_torch(tmp_path):
    random_checkpoint(tmp_path / "in", CONFIGS["marian-separate"])
    script = (
        "import sys, zoo; from zoo.interop import save_hf; "
        f"model = zoo.from_pretrained({str(tmp_path / 'in')!r}); "
        f"save_hf(model, {str(tmp_path / 'out')!r}); "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported'"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(zoo.__file__).parents[1])}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]


def test_overrides_change_zoo_fields_and_misspelt_ones_are_named(tmp_path):
    random_checkpoint(tmp_path, CONFIGS["bert"])
    model = from_pretrained(tmp_path, dropout=0.0, layer_loop="unroll")
    dropouts = [get_path(model.config, path) for path in model.config.paths("dropout")]
    assert dropouts and all(rate == 0.0 for rate in dropouts) and not model.encoder.scan
    with pytest.raises(ValueError, match="num_clases"):
        from_pretrained(tmp_path, num_clases=2)


@pytest.mark.parametrize(
    "shard", ["../other/model.safetensors", "/tmp/model.safetensors", "sub/../../model.safetensors"]
)
def test_a_shard_outside_the_checkpoint_folder_is_refused(tmp_path, shard):
    arrays = random_checkpoint(tmp_path / "other", CONFIGS["gpt2-tied"])
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIGS["gpt2-tied"]))
    index = {"weight_map": dict.fromkeys(arrays, shard)}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="outside the checkpoint folder") as error:
        from_pretrained(folder)
    assert repr(shard) in str(error.value)


def test_a_symlinked_snapshot_still_loads(tmp_path):
    """A hub snapshot's files are symlinks into the cache's blobs/: their names stay inside."""
    arrays = random_checkpoint(tmp_path / "blobs", CONFIGS["gpt2-tied"])
    folder = tmp_path / "snapshot"
    folder.mkdir()
    (folder / "config.json").symlink_to(tmp_path / "blobs" / "config.json")
    (folder / "model-00001-of-00001.safetensors").symlink_to(tmp_path / "blobs/model.safetensors")
    index = {"weight_map": dict.fromkeys(arrays, "model-00001-of-00001.safetensors")}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded, reference = from_pretrained(folder), from_pretrained(tmp_path / "blobs")
    for ours, theirs in zip(jax.tree.leaves(loaded), jax.tree.leaves(reference)):
        assert np.array_equal(ours, theirs)


def test_a_config_claiming_more_layers_than_its_weights_is_refused_before_building(tmp_path):
    random_checkpoint(tmp_path, CONFIGS["gpt2-tied"])
    (tmp_path / "config.json").write_text(json.dumps({**CONFIGS["gpt2-tied"], "n_layer": 10**6}))
    with pytest.raises(CheckpointMismatch, match=r"claims 1000000 layers .* layers 0\.\.1 at most"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize("shard", [["model.safetensors"], 3, None])
def test_a_shard_name_that_is_no_file_name_names_the_index(tmp_path, shard):
    random_checkpoint(tmp_path, CONFIGS["gpt2-tied"])
    index = tmp_path / "model.safetensors.index.json"
    (tmp_path / "model.safetensors").rename(tmp_path / "model-00001-of-00001.safetensors")
    weight_map = {"a": "model-00001-of-00001.safetensors", "b": shard}
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match="its weight_map names a shard") as caught:
        from_pretrained(tmp_path)
    assert str(caught.value).startswith(f"{index} is damaged")


def test_generation_config_end_ids_follow_the_config_and_bad_ones_name_the_file(tmp_path):
    from zoo.interop.loading import with_generation_end_ids

    generation = tmp_path / "generation_config.json"
    generation.write_text(json.dumps({"eos_token_id": [9, 2, 13]}))
    config = {"model_type": "llama", "eos_token_id": 2}
    assert with_generation_end_ids(config, tmp_path)["eos_token_id"] == [2, 9, 13]
    generation.write_text(json.dumps({"eos_token_id": "9"}))
    with pytest.raises(ValueError, match=r"eos_token_id is '9', not a token id") as caught:
        with_generation_end_ids(config, tmp_path)
    assert str(caught.value).startswith(f"{generation} is damaged")
    generation.write_text(json.dumps({"eos_token_id": 9}))
    with pytest.raises(ValueError, match=r"config\.json is damaged \(eos_token_id is True"):
        with_generation_end_ids({**config, "eos_token_id": True}, tmp_path)
