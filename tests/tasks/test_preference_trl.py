"""Every preference loss and logged metric equals TRL's on a tiny Llama and a fixed batch.

The reference differs from the policy (another random init), so the rewards are not zero. TRL's
numbers come from its own trainers' loss functions called on the same ids: `DPOTrainer`
(sigmoid, ipo, hinge, robust), `CPOTrainer(loss_type="simpo", cpo_alpha=0)` and `ORPOTrainer`.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

pytestmark = pytest.mark.hf
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
tokenizers = pytest.importorskip("tokenizers")

import jax.numpy as jnp  # noqa: E402

import zoo  # noqa: E402
from tests.tasks.tiny_llama import tiny_llama  # noqa: E402
from zoo.data.chat.preference import PreferencePair, pair_arrays  # noqa: E402
from zoo.tasks import Preference, PreferenceLoss  # noqa: E402

VOCAB = 48
PAIRS = [
    PreferencePair([1, 5, 9], [6, 7, 20, 2], [8, 2]),
    PreferencePair([1, 9, 10, 11, 3], [12, 2], [13, 14, 15, 30, 2]),
    PreferencePair([1, 40], [41, 42, 43, 2], [41, 44, 2]),
]
METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
           "logps/chosen", "logps/rejected")  # fmt: skip


def llama(seed: int):
    return tiny_llama(seed, VOCAB)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(torch policy, torch reference, zoo policy, zoo reference)."""
    out = []
    for seed in (0, 1):
        model = llama(seed)
        folder = tmp_path_factory.mktemp(f"llama{seed}")
        model.save_pretrained(folder)
        out.append((model, zoo.from_pretrained(folder)))
    return out[0][0], out[1][0], out[0][1], out[1][1]


@pytest.fixture(scope="module")
def batch():
    return pair_arrays(PAIRS, pad_id=0)


def zoo_metrics(loss, policy, reference, batch):
    from zoo.tasks import with_reference

    class One:
        def __len__(self):
            return 1

        def batch(self, step):
            return dict(batch)

    task = Preference(loss)
    data = with_reference(One(), reference).batch(0) if loss.needs_reference else dict(batch)
    value, metrics = task(policy, {k: jnp.asarray(v) for k, v in data.items()})
    return float(value), {name: float(v) for name, v in metrics.items()}


def rows(batch):
    tokens = np.concatenate([batch["tokens"][:, 0], batch["tokens"][:, 1]])
    mask = np.concatenate([batch["loss_mask"][:, 0], batch["loss_mask"][:, 1]])
    lengths = np.concatenate([batch["lengths"][:, 0], batch["lengths"][:, 1]])
    attention = (np.arange(tokens.shape[1])[None] < lengths[:, None]).astype(np.int64)
    return torch.tensor(tokens, dtype=torch.long), torch.tensor(attention), torch.tensor(mask)


def dpo_trainer(policy, reference, loss_type, beta, label_smoothing=0.0):
    from datasets import Dataset

    config = trl.DPOConfig(
        output_dir="/tmp/zoo-trl-dpo", loss_type=[loss_type], beta=beta,
        label_smoothing=label_smoothing, report_to=[], use_cpu=True, bf16=False,
        per_device_train_batch_size=len(PAIRS), max_length=None,
    )  # fmt: skip
    data = Dataset.from_list([{"prompt": "a", "chosen": "b", "rejected": "c"}])
    trainer = trl.DPOTrainer(model=policy, ref_model=reference, args=config,
                             train_dataset=data, processing_class=_tokenizer())  # fmt: skip
    trainer.model.train()
    return trainer


def trl_dpo_loss(trainer, batch):
    """TRL's DPO loss (a tensor with its graph) and metrics, `DPOTrainer._compute_loss`."""
    input_ids, attention, completion = rows(batch)
    inputs = {"input_ids": input_ids, "attention_mask": attention, "completion_mask": completion}
    loss = trainer._compute_loss(trainer.model, inputs, return_outputs=False)
    metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    return loss, metrics


def trl_dpo(policy, reference, batch, loss_type, beta, label_smoothing=0.0):
    trainer = dpo_trainer(policy, reference, loss_type, beta, label_smoothing)
    loss, metrics = trl_dpo_loss(trainer, batch)
    return float(loss.detach()), metrics


def _tokenizer():
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(VOCAB)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="t3"))
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="t0", bos_token="t1", eos_token="t2", unk_token="t3"
    )


@pytest.mark.parametrize(
    ("kind", "settings"),
    [("sigmoid", {}), ("ipo", {}), ("hinge", {}), ("robust", {"label_smoothing": 0.2})],
)
def test_dpo_losses_equal_trl(models, batch, kind, settings):
    policy_pt, reference_pt, policy, reference = models
    beta = 0.3
    expected_loss, expected = trl_dpo(policy_pt, reference_pt, batch, kind, beta, **settings)
    loss, metrics = zoo_metrics(PreferenceLoss(kind=kind, beta=beta, **settings), policy,
                                reference, batch)  # fmt: skip
    assert abs(metrics["rewards/margins"]) > 1e-3  # the reference differs from the policy
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    for name in METRICS:
        assert metrics[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-6), name


def mixtral(seed: int):
    """A tiny Mixtral whose router losses count (`output_router_logits` on, coefficient 0.02)."""
    torch.manual_seed(seed)
    config = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02,
        output_router_logits=True, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        attention_dropout=0.0,
    )  # fmt: skip
    return transformers.MixtralForCausalLM(config).float().eval()


def test_dpo_on_a_mixture_of_experts_adds_the_load_balancing_loss_as_trl(tmp_path, batch):
    """TRL's DPOTrainer adds `router_aux_loss_coef * aux_loss` of the policy's forward over
    every real token of the chosen and rejected rows; zoo's Preference adds the same."""
    torch_models, zoo_models = [], []
    for seed in (0, 1):
        model = mixtral(seed)
        model.save_pretrained(tmp_path / f"mixtral{seed}")
        torch_models.append(model)
        zoo_models.append(zoo.from_pretrained(tmp_path / f"mixtral{seed}"))
    policy, reference = zoo_models
    experts = policy.config.experts()
    assert experts is not None and experts.aux_loss_coef == 0.02
    expected_loss, expected = trl_dpo(*torch_models, batch, "sigmoid", 0.3)
    loss, metrics = zoo_metrics(PreferenceLoss(beta=0.3), policy, reference, batch)
    assert 0.02 * metrics["router_aux_loss"] > 1e-3  # a term the comparison below can see
    assert metrics["router_aux_loss"] == pytest.approx(expected["aux_loss"], rel=1e-5)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    for name in METRICS:
        assert metrics[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-6), name


def test_one_sgd_step_moves_the_loss_as_trl(models, batch):
    """The gradients agree: one plain SGD step gives the same new loss in both."""
    import copy

    import equinox as eqx
    import jax

    from zoo.tasks import with_reference

    policy_pt, reference_pt, policy, reference = models
    rate, beta = 2.0, 0.3
    trainer = dpo_trainer(copy.deepcopy(policy_pt), reference_pt, "sigmoid", beta)
    loss, _ = trl_dpo_loss(trainer, batch)
    loss.backward()
    with torch.no_grad():
        for parameter in trainer.model.parameters():
            parameter -= rate * parameter.grad
    trl_after, _ = trl_dpo_loss(trainer, batch)

    class One:
        def __len__(self):
            return 1

        def batch(self, step):
            return dict(batch)

    data = {k: jnp.asarray(v) for k, v in with_reference(One(), reference).batch(0).items()}
    task = Preference(PreferenceLoss(beta=beta))
    params, static = eqx.partition(policy, eqx.is_inexact_array)
    grads = jax.grad(lambda p: task(eqx.combine(p, static), data)[0])(params)
    moved = jax.tree_util.tree_map(lambda p, g: p - rate * g, params, grads)
    after, _ = task(eqx.combine(moved, static), data)
    assert abs(float(after) - float(loss)) > 1e-3  # the step changed the loss
    assert float(after) == pytest.approx(float(trl_after), rel=1e-5)


def _fake(trainer_class, **attributes):
    """An object carrying the attributes TRL's loss methods read, with those methods bound."""
    accelerator = types.SimpleNamespace(device="cpu", gather_for_metrics=lambda x: x)
    fake = types.SimpleNamespace(accelerator=accelerator, is_encoder_decoder=False,
                                 aux_loss_enabled=False, **attributes)  # fmt: skip
    for name in ("concatenated_forward", "get_batch_loss_metrics", "cpo_loss", "odds_ratio_loss"):
        if hasattr(trainer_class, name):
            setattr(fake, name, types.MethodType(getattr(trainer_class, name), fake))
    fake.concatenated_inputs = trainer_class.concatenated_inputs
    fake.get_batch_logps = trainer_class.get_batch_logps
    return fake


def cpo_style_batch(batch):
    """TRL's CPO/ORPO batch: ids, attention masks, and labels (-100 off the answer)."""
    out = {}
    for side, name in enumerate(("chosen", "rejected")):
        tokens = torch.tensor(batch["tokens"][:, side], dtype=torch.long)
        length = torch.tensor(batch["lengths"][:, side])
        attention = (torch.arange(tokens.shape[1])[None] < length[:, None]).long()
        mask = torch.tensor(batch["loss_mask"][:, side])
        out[f"{name}_input_ids"] = tokens
        out[f"{name}_attention_mask"] = attention
        out[f"{name}_labels"] = torch.where(mask == 1, tokens, torch.tensor(-100))
    return out


def test_simpo_equals_trl_cpo(models, batch):
    from trl.experimental.cpo import CPOTrainer

    policy_pt, _, policy, reference = models
    beta, gamma = 2.0, 0.3
    fake = _fake(CPOTrainer, loss_type="simpo", beta=beta, simpo_gamma=gamma, label_smoothing=0.0,
                 cpo_alpha=0.0, alpha=0.0, pad_token_id=0)  # fmt: skip
    with torch.no_grad():
        expected_loss, expected = fake.get_batch_loss_metrics(policy_pt, cpo_style_batch(batch))
    loss, metrics = zoo_metrics(PreferenceLoss(kind="simpo", beta=beta, gamma=gamma), policy,
                                reference, batch)  # fmt: skip
    assert loss == pytest.approx(float(expected_loss), rel=1e-5)
    for name in METRICS:
        assert metrics[name] == pytest.approx(float(expected[name]), rel=1e-5, abs=1e-6), name


def test_orpo_equals_trl(models, batch):
    from trl.experimental.orpo import ORPOTrainer

    policy_pt, _, policy, reference = models
    beta = 0.25
    fake = _fake(ORPOTrainer, beta=beta, padding_value=0)
    with torch.no_grad():
        expected_loss, expected = fake.get_batch_loss_metrics(policy_pt, cpo_style_batch(batch))
    loss, metrics = zoo_metrics(PreferenceLoss(kind="orpo", beta=beta), policy, reference, batch)
    assert loss == pytest.approx(float(expected_loss), rel=1e-5)
    for name in (*METRICS, "nll_loss", "log_odds_ratio", "log_odds_chosen"):
        assert metrics[name] == pytest.approx(float(expected[name]), rel=1e-5, abs=1e-6), name


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_tokenizer(folder):
    """A byte-level BPE with ChatML special tokens and template, saved as transformers does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    backend.train_from_iterator(["What color is the sky? It is blue, or green."] * 20, trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<|im_end|>"
    )
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(folder)
    return tokenizer


def test_conversational_rows_tokenize_as_trl(tmp_path):
    from datasets import Dataset

    from zoo.data.chat.preference import encode_rows
    from zoo.interop.tokenizers.hf_tokenizer import pretrained_tokenizer

    tokenizer = chat_tokenizer(tmp_path)
    sky = [{"role": "user", "content": "What color is the sky?"}]
    rows = [
        {"prompt": sky, "chosen": [{"role": "assistant", "content": "It is blue."}],
         "rejected": [{"role": "assistant", "content": "It is green, or blue."}]},
        {"chosen": [*sky, {"role": "assistant", "content": "Blue."}],  # implicit prompt
         "rejected": [*sky, {"role": "assistant", "content": "Green."}]},
    ]  # fmt: skip
    config = trl.DPOConfig(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True,
                           max_length=None)  # fmt: skip
    expected = []
    for row in rows:  # TRL reads one format per dataset
        model = llama_of(len(tokenizer))
        trainer = trl.DPOTrainer(model=model, ref_model=llama_of(len(tokenizer)), args=config,
                                 train_dataset=Dataset.from_list([row]),
                                 processing_class=tokenizer)  # fmt: skip
        expected.append(trainer.train_dataset[0])
    ours = encode_rows(rows, pretrained_tokenizer(tmp_path))
    for pair, trl_row in zip(ours, expected, strict=True):
        assert pair.prompt == trl_row["prompt_ids"]
        assert pair.chosen == trl_row["chosen_ids"]
        assert pair.rejected == trl_row["rejected_ids"]


def llama_of(vocab_size: int):
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def test_a_continued_adapter_has_trl_reference(models, batch, tmp_path):
    """TRL's `DPOTrainer` given a `PeftModel` (no `ref_model`, no `peft_config`) trains its
    adapter further and compares it with a frozen copy of the adapter ("ref"): the reference is
    the SFT model, not the base. zoo's `reference_adapters` gives TRL's loss and metrics."""
    peft = pytest.importorskip("peft")
    from zoo.tasks import adapter_values

    policy_pt = llama(0)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                             lora_dropout=0.0)  # fmt: skip
    sft_pt = peft.get_peft_model(policy_pt, config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a trained adapter: B is not zero
        for name, parameter in sft_pt.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    sft_pt.save_pretrained(tmp_path / "sft")
    trainer = dpo_trainer(sft_pt, None, "sigmoid", 0.3)
    assert "ref" in trainer.model.peft_config  # TRL's frozen copy of the adapter
    with torch.no_grad():  # the adapter trained further: TRL's "default" moves, "ref" stays
        for name, parameter in trainer.model.named_parameters():
            if "lora_B.default" in name:
                parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))
    trainer.model.save_pretrained(tmp_path / "moved")  # the "default" adapter only
    expected_loss, expected = trl_dpo_loss(trainer, batch)

    base = models[2]
    sft = zoo.lora.load_adapter(base, tmp_path / "sft")
    policy = zoo.lora.load_adapter(base, tmp_path / "moved")
    task = Preference(
        PreferenceLoss(beta=0.3), reference="adapters", reference_adapters=adapter_values(sft)
    )
    value, metrics = task(policy, {k: jnp.asarray(v) for k, v in batch.items()})
    expected_loss = expected_loss.detach()
    assert abs(float(expected_loss) - np.log(2)) > 1e-3  # the adapter moved from the reference
    assert float(value) == pytest.approx(float(expected_loss), rel=1e-5)
    for name in METRICS:
        assert float(metrics[name]) == pytest.approx(expected[name], rel=1e-4, abs=1e-5)
    # the base as reference (the adapters off) is another number
    off, _ = Preference(PreferenceLoss(beta=0.3), reference="adapters")(
        policy, {k: jnp.asarray(v) for k, v in batch.items()}
    )
    assert abs(float(off) - float(expected_loss)) > 1e-3


def declared_bos_tokenizer(folder, *, adds_bos: bool, fast: bool):
    """A byte-level BPE declaring bos `<s>` and eos `<|im_end|>`, with ChatML. With `adds_bos`
    its post-processor puts bos first (as Llama 3's); without, bos is declared only (as
    SmolLM2's). `fast`: a Llama `config.json` beside it, so zoo reads `tokenizer.json` itself
    (`FastTokenizer`), else through transformers (`HFTokenizer`)."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<s>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    backend.train_from_iterator(["What color is the sky? It is blue, or green."] * 20, trainer)
    if adds_bos:
        backend.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
        )
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="<|im_end|>"
    )
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(folder)
    if fast:
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return tokenizer


SKY = [{"role": "user", "content": "What color is the sky?"}]
TEXT_ROWS = [
    {"prompt": "What color is the sky?", "chosen": " It is blue.", "rejected": " It is green."},
    {"prompt": "The sky is", "chosen": " blue, or green.", "rejected": " green."},
]
CHAT_ROWS = [
    {"prompt": SKY, "chosen": [{"role": "assistant", "content": "It is blue."}],
     "rejected": [{"role": "assistant", "content": "It is green, or blue."}]},
]  # fmt: skip


def trl_dpo_tokenized(tokenizer, rows):
    """`DPOTrainer._prepare_dataset` on `rows`: (prompt, chosen, rejected) ids of each."""
    from datasets import Dataset

    fake = types.SimpleNamespace(_tokenizer=tokenizer)
    args = types.SimpleNamespace(dataset_num_proc=None, max_length=None,
                                 truncation_mode="keep_start")  # fmt: skip
    data = trl.DPOTrainer._prepare_dataset(fake, Dataset.from_list(rows), tokenizer, args, "t")
    return [(row["prompt_ids"], row["chosen_ids"], row["rejected_ids"]) for row in data]


def trl_cpo_tokenized(trainer_class, tokenizer, rows):
    """The CPO/ORPO trainers' preparation of `rows` (the chat template applied, then
    `tokenize_row`): (prompt, chosen, rejected) ids of each."""
    from trl.data_utils import maybe_apply_chat_template

    fake = types.SimpleNamespace(processing_class=tokenizer, is_encoder_decoder=False,
                                 max_length=10**6)  # fmt: skip
    fake.build_tokenized_answer = types.MethodType(trainer_class.build_tokenized_answer, fake)
    out = []
    for row in rows:
        ids = trainer_class.tokenize_row(fake, maybe_apply_chat_template(row, tokenizer))
        prompt = ids["prompt_input_ids"]
        answers = []
        for side in ("chosen", "rejected"):
            start = sum(1 for label in ids[f"{side}_labels"] if label == -100)
            assert ids[f"{side}_input_ids"][:start] == prompt
            answers.append(ids[f"{side}_input_ids"][start:])
        out.append((prompt, *answers))
    return out


@pytest.mark.parametrize("fast", [True, False], ids=["tokenizer.json", "transformers"])
@pytest.mark.parametrize("adds_bos", [False, True], ids=["declares-bos", "adds-bos"])
@pytest.mark.parametrize("objective", ["dpo", "simpo", "orpo"])
def test_special_tokens_follow_trls_trainer_of_the_objective(tmp_path, objective, adds_bos, fast):
    """DPOTrainer puts bos first where the tokenizer does; the CPO (SimPO) and ORPO trainers
    put bos first (and eos last) on every row. zoo's ids equal TRL's for text and chat rows."""
    from trl.experimental.cpo import CPOTrainer
    from trl.experimental.orpo import ORPOTrainer

    from zoo.data.chat.preference import PreferenceDataConfig, encode_rows, special_tokens_for
    from zoo.interop.tokenizers.hf_tokenizer import pretrained_tokenizer

    tokenizer = declared_bos_tokenizer(tmp_path, adds_bos=adds_bos, fast=fast)
    ours_tokenizer = pretrained_tokenizer(tmp_path)
    assert type(ours_tokenizer).__name__ == ("FastTokenizer" if fast else "HFTokenizer")
    config = PreferenceDataConfig(special_tokens=special_tokens_for(objective))
    trainer_class = {"simpo": CPOTrainer, "orpo": ORPOTrainer}.get(objective)
    for rows in (TEXT_ROWS, CHAT_ROWS):
        if trainer_class is None:
            expected = trl_dpo_tokenized(tokenizer, rows)
        else:
            expected = trl_cpo_tokenized(trainer_class, tokenizer, rows)
        ours = encode_rows(rows, ours_tokenizer, config=config)
        assert [(p.prompt, p.chosen, p.rejected) for p in ours] == expected
        bos_first = objective != "dpo" or (adds_bos and rows is TEXT_ROWS)
        assert all((pair.prompt[0] == tokenizer.bos_token_id) == bos_first for pair in ours)
