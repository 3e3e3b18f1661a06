"""The names TRL and HF `TrainingArguments` give to `zoo train`'s options, for `--config` files.

A `--config` file written for TRL's `SFTConfig` / `DPOConfig` (or HF's `TrainingArguments`)
keeps working where zoo has the same option: `learning_rate` is read as `--lr`,
`num_train_epochs` as `--epochs`, `loss_type: sigmoid` as `--objective dpo` (`ALIASES`). A name
whose option zoo does not have is refused with the reason, or with the flag that comes closest
(`NOT_OFFERED`); a setting that only repeats what zoo always does (`optim: adamw_torch`) is
accepted and said (`SAME_AS_ZOO`). docs/coming-from-trl.md is the table for people.

`per_device_train_batch_size` is TRL's batch of one forward pass; zoo's `--batch-size` is the
batch of one optimizer step, which `--accumulate` cuts into micro-batches. So the file's
`per_device_train_batch_size` times its `gradient_accumulation_steps` becomes `--batch-size`.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from zoo.cli._config_load import shown


@dataclass(frozen=True, kw_only=True)
class Alias:
    """A TRL/HF name of a zoo flag, and how its values read."""

    flag: str  # the zoo flag's name as argparse keeps it (`batch_size` for --batch-size)
    # TRL's value -> zoo's value, where the two spell them differently (empty: as given);
    # a value it does not list is refused
    values: Mapping[object, object] = field(default_factory=dict)
    unset: tuple[object, ...] = ()  # values that mean "not set" (HF's max_steps -1)


# TRL's preference losses (DPOConfig.loss_type; CPOConfig's "simpo") -> zoo's --objective
LOSS_TYPES: dict[object, object] = {"sigmoid": "dpo", "ipo": "ipo", "hinge": "hinge", "robust": "robust",
              "simpo": "simpo"}  # fmt: skip
# HF's lr_scheduler_type -> zoo's --schedule (zoo's constant warms up over --warmup first)
SCHEDULES: dict[object, object] = {"cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant",
             "inverse_sqrt": "inverse_sqrt"}  # fmt: skip

ALIASES: dict[str, Alias] = {
    "learning_rate": Alias(flag="lr"),
    "per_device_train_batch_size": Alias(flag="batch_size"),
    "gradient_accumulation_steps": Alias(flag="accumulate"),
    "num_train_epochs": Alias(flag="epochs"),
    "max_steps": Alias(flag="steps", unset=(-1,)),  # HF's -1: not set, the epochs decide
    "max_length": Alias(flag="max_len"),
    "max_seq_length": Alias(flag="max_len"),  # the name in older TRL
    "max_prompt_length": Alias(flag="max_prompt_len"),
    "max_completion_length": Alias(flag="max_completion_len"),
    "warmup_steps": Alias(flag="warmup"),
    "lr_scheduler_type": Alias(flag="schedule", values=SCHEDULES),
    "loss_type": Alias(flag="objective", values=LOSS_TYPES),
    "max_grad_norm": Alias(flag="clip_norm"),
    "label_smoothing_factor": Alias(flag="label_smoothing"),
    "logging_steps": Alias(flag="log_every"),
    "eval_steps": Alias(flag="eval_every"),
    "save_steps": Alias(flag="checkpoint_every"),
    "save_total_limit": Alias(flag="keep"),
    "output_dir": Alias(flag="out"),
    "model_name_or_path": Alias(flag="init"),
    "dataset_text_field": Alias(flag="text_column"),
    "packing": Alias(flag="pack"),
    "chat_template_path": Alias(flag="template"),
    "completion_only_loss": Alias(flag="train_on", values={True: "completion", False: "all"}),
    "assistant_only_loss": Alias(flag="train_on", values={True: "assistant"}, unset=(False,)),
    "precompute_ref_log_probs": Alias(flag="precompute_reference"),
    "bf16": Alias(flag="precision", values={True: "bf16", False: "fp32"}),
    "report_to": Alias(
        flag="log", values={"none": [], "tensorboard": ["tensorboard"], "wandb": ["wandb"]}
    ),
    "resume_from_checkpoint": Alias(flag="resume", values={True: True, False: False}),
}

# names zoo has no option for: why, or the flag that does the nearest thing
NOT_OFFERED: dict[str, str] = {
    "warmup_ratio": "did you mean --warmup? zoo's warmup is a number of steps",
    "lr_scheduler_kwargs": "not offered: zoo's schedules take --lr, --warmup and --steps only",
    "per_device_eval_batch_size": "not offered: evaluation runs at --batch-size",
    "fp16": "not offered: zoo computes in bf16 or fp32 (--precision); fp16 needs loss scaling",
    "tf32": "not offered: XLA chooses the matmul precision",
    "optim": "not offered: zoo trains with AdamW (optax.adamw)",
    "adam_beta1": "not offered: zoo's AdamW keeps β1 = 0.9",
    "adam_beta2": "not offered: zoo's AdamW keeps β2 = 0.999",
    "adam_epsilon": "not offered: zoo's AdamW keeps ε = 1e-8",
    "eval_strategy": "not offered: zoo counts in steps (--eval-every N)",
    "evaluation_strategy": "not offered: zoo counts in steps (--eval-every N)",
    "save_strategy": "not offered: zoo counts in steps (--checkpoint-every N)",
    "logging_strategy": "not offered: zoo counts in steps (--log-every N)",
    "logging_dir": "not offered: a run logs in --out (metrics.jsonl; --log tensorboard)",
    "run_name": "not offered: a run is named by its --out folder",
    "gradient_checkpointing_kwargs": "not offered: --gradient-checkpointing recomputes whole "
    "layers (--set remat=dots keeps the matmuls)",
    "torch_compile": "not offered: every step is compiled by XLA already",
    "push_to_hub": "not offered: zoo export --hf writes a folder you can upload",
    "hub_model_id": "not offered: zoo export --hf writes a folder you can upload",
    "dataloader_num_workers": "not offered: batches are cut from arrays in memory",
    "dataset_num_proc": "not offered: the data is tokenized in one process",
    "use_peft": "did you mean --lora rank=R,alpha=A,targets=...?",
    "lora_r": "did you mean --lora rank=R?",
    "lora_alpha": "did you mean --lora alpha=A?",
    "lora_target_modules": "did you mean --lora targets=...?",
    "load_in_8bit": "did you mean --quantize int8 (with --lora)?",
    "load_in_4bit": "not offered: the quantized base of --lora is int8 (--quantize int8)",
    "rpo_alpha": "not offered: zoo's DPO adds no NLL term",
    "cpo_alpha": "not offered: zoo's SimPO adds no behaviour-cloning term",
    "reference_free": "not offered: use --objective simpo or orpo, which read no reference",
    "ref_model_init_kwargs": "not offered: give --reference RUN_OR_FOLDER",
    "sync_ref_model": "not offered: the reference stays the model it starts as",
    "padding_free": "did you mean --pack? packed rows keep conversations apart",
    "neftune_noise_alpha": "not offered: no noise is added to the embeddings",
    "eos_token": "not offered: the end-of-turn token is the tokenizer's and the template's",
    "pad_token": "not offered: the padding token is the tokenizer's",
    "deepspeed": "not offered: zoo shards over devices with --mesh",
    "fsdp": "not offered: zoo shards over devices with --mesh (e.g. --mesh fsdp=8)",
}


# settings zoo always has: accepted (and said) with these values, refused with others
SAME_AS_ZOO: dict[str, tuple[object, ...]] = {
    "optim": ("adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw"),
    "adam_beta1": (0.9,),
    "adam_beta2": (0.999,),
    "adam_epsilon": (1e-8,),
}


def same_as_zoo(key: str, value: object) -> bool:
    """Whether `key: value` only repeats what zoo does anyway (`optim: adamw_torch`)."""
    return value in SAME_AS_ZOO.get(key, ())


def alias_of(key: str) -> Alias | None:
    """The zoo flag the TRL/HF name `key` stands for (None: not one of TRL's names)."""
    return ALIASES.get(key)


def refusal_of(key: str) -> str | None:
    """Why `key`, a TRL/HF name zoo does not take, is refused (None: not such a name)."""
    return NOT_OFFERED.get(key)


def trl_value(key: str, alias: Alias, value: object) -> object:
    """`value` of the TRL name `key` as its zoo flag takes it (None: as if left out); raises
    ValueError for a value with no zoo equivalent."""
    if value is None or value in alias.unset:
        return None
    if not alias.values or (alias.flag == "log" and isinstance(value, list)):
        return value  # as given: zoo's flag checks it (each --log item against its choices)
    if isinstance(value, Hashable) and value in alias.values:
        return alias.values[value]
    choices = ", ".join(repr(choice) for choice in alias.values)
    raise ValueError(f"{key}: {shown(value)} has no zoo equivalent; {key} takes {choices}")
