"""The PyTorch peer's models, optimizer and loss: HuggingFace transformers mirrors of zoo configs.

| zoo flavor | peer model |
| --- | --- |
| gpt | `GPT2LMHeadModel`; a rotary GPT: `LlamaForCausalLM` (or Mistral/Qwen2/Qwen3); a mixture of experts: `MixtralForCausalLM` (or Qwen2-MoE/Qwen3-MoE/OLMoE) |
| classifier | `BertForSequenceClassification` |
| translator | `MarianMTModel` |

Each peer is built from a config that mirrors the zoo config (widths, depth, heads, vocabulary,
positions, activation, dropout), randomly initialised, with `attn_implementation="sdpa"`.
Needs the `bench` extra: `pip install 'jax-transformer-zoo[bench]'`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from zoo.extras import pip_install
from zoo.interop.architecture import activation_dropout, export_activation
from zoo.interop.architectures.llama import LlamaFamily, decoder_family_for
from zoo.interop.architectures.moe import moe_family_for
from zoo.models import ClassifierConfig, GPTConfig, TransformerConfig, TranslatorConfig

MODEL_CLASSES = {
    "gpt": "GPT2LMHeadModel",
    "classifier": "BertForSequenceClassification",
    "translator": "MarianMTModel",
}


def import_torch():
    """(torch, transformers), or an ImportError that says how to install them."""
    try:
        import torch
        import transformers
    except ImportError as error:
        raise ImportError(
            f"--peer torch needs torch and transformers ({error}); "
            f"install them with {pip_install('bench')}"
        ) from error
    return torch, transformers


def is_decoder_family(config: TransformerConfig, flavor: str) -> bool:
    """A GPT with rotary positions: its peer is the Llama-style class it exports to."""
    return flavor == "gpt" and config.layers.block.attention.rope is not None


def family_for(config: GPTConfig) -> LlamaFamily:
    """The HF family of a rotary GPT: a mixture-of-experts one (`zoo.interop` exports to) when
    the config has experts, else the dense Llama-style one."""
    if config.experts() is not None:
        return moe_family_for(config)
    return decoder_family_for(config)


def peer_class(config: TransformerConfig, flavor: str) -> str:
    """The transformers class that mirrors `config`."""
    if isinstance(config, GPTConfig) and is_decoder_family(config, flavor):
        return family_for(config).export_class
    return MODEL_CLASSES[flavor]


def hf_config(config: TransformerConfig, flavor: str) -> Any:
    """A transformers config with the shapes of the zoo `config` (its base blocks')."""
    _, transformers = import_torch()
    if isinstance(config, GPTConfig) and is_decoder_family(config, flavor):
        family = family_for(config)
        fields = family.hf_config(config)
        fields = {k: v for k, v in fields.items() if k not in ("model_type", "architectures")}
        return getattr(transformers, family.config_class)(**fields, attn_implementation="sdpa")
    common = dict(vocab_size=config.vocab_size, attn_implementation="sdpa")
    activation = export_activation(config)
    block = config.layers.block
    if isinstance(config, GPTConfig):
        return transformers.GPT2Config(
            n_positions=config.max_positions,
            n_embd=config.d_model,
            n_layer=config.num_layers,
            n_head=config.num_heads,
            n_inner=block.feed_forward.d_ff,
            activation_function=activation,
            resid_pdrop=block.dropout,
            embd_pdrop=config.embedder.dropout,
            attn_pdrop=block.attention.dropout,
            layer_norm_epsilon=block.norm.eps,
            tie_word_embeddings=config.head.tie,
            bos_token_id=config.bos_id,
            eos_token_id=config.eos_id,
            pad_token_id=config.pad_id,
            **common,
        )
    if isinstance(config, ClassifierConfig):
        return transformers.BertConfig(
            hidden_size=config.d_model,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            intermediate_size=block.feed_forward.d_ff,
            hidden_act=activation,
            max_position_embeddings=config.max_positions,
            type_vocab_size=max(config.embedder.type_vocab_size, 1),
            layer_norm_eps=block.norm.eps,
            hidden_dropout_prob=block.dropout,
            attention_probs_dropout_prob=block.attention.dropout,
            num_labels=config.head.num_classes,
            pad_token_id=config.pad_id or 0,
            **common,
        )
    if not isinstance(config, TranslatorConfig):
        raise TypeError(f"no peer for a {type(config).__name__}")
    decoder = config.decoder.block
    return transformers.MarianConfig(
        d_model=config.d_model,
        encoder_layers=config.num_layers,
        decoder_layers=config.decoder_layers,
        encoder_attention_heads=config.num_heads,
        decoder_attention_heads=decoder.attention.num_heads,
        encoder_ffn_dim=block.feed_forward.d_ff,
        decoder_ffn_dim=decoder.feed_forward.d_ff,
        activation_function=activation,
        max_position_embeddings=config.max_positions,
        dropout=block.dropout,
        attention_dropout=block.attention.dropout,
        activation_dropout=activation_dropout(config),
        scale_embedding=config.embedder.scale,
        share_encoder_decoder_embeddings=config.share_embeddings,
        tie_word_embeddings=config.head.tie,
        pad_token_id=config.pad_id or 0,
        decoder_start_token_id=config.bos_id,
        eos_token_id=config.eos_id,
        **common,
    )


def build_peer(config: TransformerConfig, flavor: str, *, seed: int = 0) -> Any:
    """The randomly initialised transformers model that mirrors `config`."""
    torch, transformers = import_torch()
    torch.manual_seed(seed)
    return getattr(transformers, peer_class(config, flavor))(hf_config(config, flavor))


def adamw(model: Any, *, lr: float = 1e-4, weight_decay: float = 0.01, fused: bool = False):
    """torch AdamW with zoo's decay mask: weight matrices decay; biases, norms, embeddings not."""
    torch, _ = import_torch()
    embeddings = {
        id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()
    }
    decay: list[Any] = []
    rest: list[Any] = []
    for parameter in model.parameters():
        if not parameter.requires_grad:
            continue
        matrix = parameter.ndim == 2 and id(parameter) not in embeddings
        (decay if matrix else rest).append(parameter)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8, fused=fused)


class PeerTask:
    """Forward and loss of one flavor on torch tensors, mirroring `zoo.tasks`."""

    def __init__(
        self, flavor: str, config: TransformerConfig, batch: dict[str, np.ndarray], device: str
    ):
        torch, _ = import_torch()
        self.flavor = flavor
        self.pad_id = config.pad_id
        # a mixture of experts trains on its load-balancing loss too, as zoo's task does
        experts = config.experts()
        self.router_coef = 0.0 if experts is None else float(experts.aux_loss_coef)
        self.batch = {
            name: torch.as_tensor(value).long().to(device) for name, value in batch.items()
        }

    def inputs(self, *, train: bool = False) -> dict[str, Any]:
        """Keyword arguments of the peer model (what the zoo model reads); in training a mixture
        of experts also returns its routers' load-balancing loss (`aux_loss`)."""
        b = self.batch
        if self.flavor == "gpt":
            if train and self.router_coef:
                return {"input_ids": b["tokens"][:, :-1], "output_router_logits": True}
            return {"input_ids": b["tokens"][:, :-1]}
        if self.flavor == "classifier":
            mask = None if self.pad_id is None else (b["tokens"] != self.pad_id).long()
            return {"input_ids": b["tokens"], "attention_mask": mask}
        mask = None if self.pad_id is None else (b["src"] != self.pad_id).long()
        return {
            "input_ids": b["src"],
            "attention_mask": mask,
            "decoder_input_ids": b["tgt"][:, :-1],
        }

    def loss(self, logits: Any) -> Any:
        """Mean fp32 cross-entropy over the scored positions (targets that are not padding)."""
        torch, _ = import_torch()
        b = self.batch
        if self.flavor == "classifier":
            return torch.nn.functional.cross_entropy(logits.float(), b["labels"])
        targets = b["tokens"][:, 1:] if self.flavor == "gpt" else b["tgt"][:, 1:]
        ignore = -100 if self.pad_id is None else self.pad_id
        return torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=ignore
        )

    def objective(self, outputs: Any) -> Any:
        """The training loss of the peer's outputs (of `inputs(train=True)`): the cross-entropy,
        plus `router_aux_loss_coef` times the load-balancing loss for a mixture of experts (as
        `zoo.tasks.router_losses` adds it)."""
        loss = self.loss(outputs.logits)
        if self.router_coef and getattr(outputs, "aux_loss", None) is not None:
            loss = loss + self.router_coef * outputs.aux_loss
        return loss
