"""GPT-2 (`GPT2LMHeadModel`, `GPT2Model`) <-> `zoo.GPT`.

GPT-2 is pre-LN with learned positions and a tanh-GELU MLP. Its projections are `Conv1D`
(`[in, out]`, transposed relative to zoo's `[out, in]`) and its query/key/value live in one
fused `c_attn`, split here into three.
"""

from __future__ import annotations

from collections.abc import Mapping

from zoo.interop.architecture import (
    Architecture,
    ConfigFields,
    HFConfig,
    UnsupportedExport,
    export_activation,
    refuse_layer_overrides,
    require_fields,
    warn_activation_dropout,
)
from zoo.interop.files import HFDict
from zoo.interop.rules import (
    FUSED_QKV_BIAS,
    FUSED_QKV_WEIGHT,
    TRANSPOSE,
    KeyMap,
    Rule,
    Shape,
    rule,
    weight_and_bias,
)
from zoo.models import GPTConfig
from zoo.models.gpt import LMHead
from zoo.presets import parts

# transformers' GPT2Config defaults, for options a config.json leaves out
DEFAULTS: HFDict = dict(
    vocab_size=50257,
    n_positions=1024,
    n_embd=768,
    n_layer=12,
    n_head=12,
    n_inner=None,
    activation_function="gelu_new",
    resid_pdrop=0.1,
    embd_pdrop=0.1,
    attn_pdrop=0.1,
    layer_norm_epsilon=1e-5,
    initializer_range=0.02,
    scale_attn_weights=True,
    scale_attn_by_inverse_layer_idx=False,
    reorder_and_upcast_attn=False,
    add_cross_attention=False,
    tie_word_embeddings=True,
    bos_token_id=50256,
    eos_token_id=50256,
)

# GPT-2's fixed parts: what loading sets and exporting requires of a zoo config (paths)
PARTS: ConfigFields = {
    "embedder.positions": "learned",
    "embedder.norm": None,
    "embedder.scale": False,
    "norm.kind": "layernorm",
    "norm.bias": True,
    "norm_first": True,
    "output_norm": False,
    "attention_norm": True,
    "attention.qkv_bias": True,
    "attention.output_bias": True,
    "attention.qk_norm": None,
    "attention.scale_dim": None,
    "attention.softcap": None,
    "attention.rope": None,
    "attention.window": None,
    "feed_forward.kind": "dense",
    "feed_forward.bias": True,
    "head.softcap": None,
}


class GPT2(Architecture[GPTConfig]):
    name = "gpt2"
    model_type = "gpt2"
    loads = ("GPT2LMHeadModel", "GPT2Model")
    export_class = "GPT2LMHeadModel"
    prefix = "transformer."
    config_class = "GPT2Config"
    zoo_config_class = GPTConfig
    zoo_base = parts.GPT2

    def hf_defaults(self) -> HFDict:
        return dict(DEFAULTS)

    def zoo_fields(self, hf: HFConfig, shapes: Mapping[str, Shape]) -> ConfigFields:
        hf.require("scale_attn_weights", (True,), "zoo always scales scores by 1/sqrt(head_dim)")
        hf.require(
            "scale_attn_by_inverse_layer_idx", (False,), "zoo scales every layer's scores alike"
        )
        hf.require("add_cross_attention", (False,), "zoo.GPT has no cross-attention")
        # reorder_and_upcast_attn only changes the order and precision of float16 arithmetic:
        # in float32 the scores are the same, so it needs no mapping.
        vocab = hf["vocab_size"]
        d_model = hf["n_embd"]
        return {
            "vocab_size": vocab,
            "d_model": d_model,
            "num_heads": hf["n_head"],
            "num_layers": hf["n_layer"],
            "d_ff": hf["n_inner"] or 4 * d_model,
            "max_positions": hf["n_positions"],
            "feed_forward.activation": hf.activation("activation_function"),
            "norm.eps": hf["layer_norm_epsilon"],
            "embedder.dropout": hf["embd_pdrop"],
            "layers.block.dropout": hf["resid_pdrop"],
            "attention.dropout": hf["attn_pdrop"],
            "feed_forward.dropout": 0.0,  # GPT-2's MLP has no dropout on its hidden layer
            "init_std": hf["initializer_range"],
            "head": LMHead(tie=bool(hf["tie_word_embeddings"])),
            # GPT-2 masks padding through attention_mask only, never by token id: an id-based
            # mask would hide every <|endoftext|> inside a document.
            "pad_id": None,
            "bos_id": hf.token_id("bos_token_id", vocab),
            "eos_id": hf.token_id("eos_token_id", vocab),
            **PARTS,
        }

    def hf_config(self, config: GPTConfig) -> HFDict:
        require_fields(config, self.export_class, PARTS)
        refuse_layer_overrides(config, self.export_class)
        warn_activation_dropout(config, self.export_class)
        block = config.layers.block
        if (
            config.kv_heads != config.num_heads
            or config.head_dim * config.num_heads != config.d_model
        ):
            raise UnsupportedExport(
                f"{self.export_class} has one key/value head per query head, each d_model / "
                f"num_heads wide: attention.num_kv_heads={block.attention.num_kv_heads}, "
                f"attention.head_dim={block.attention.head_dim}"
            )
        return dict(
            model_type=self.model_type,
            architectures=[self.export_class],
            vocab_size=config.vocab_size,
            n_positions=config.max_positions,
            n_embd=config.d_model,
            n_layer=config.num_layers,
            n_head=config.num_heads,
            n_inner=block.feed_forward.d_ff,
            activation_function=export_activation(config),
            resid_pdrop=block.dropout,
            embd_pdrop=config.embedder.dropout,
            attn_pdrop=block.attention.dropout,
            layer_norm_epsilon=block.norm.eps,
            initializer_range=config.init_std,
            tie_word_embeddings=config.head.tie,
            bos_token_id=config.bos_id,
            eos_token_id=config.eos_id,
            pad_token_id=config.pad_id,
        )

    def key_map(self, config: GPTConfig, shapes: Mapping[str, Shape] | None = None) -> KeyMap:
        tie = config.head.tie
        tied = ("lm_head.weight",) if tie else ()
        rules = [
            rule("transformer.wte.weight", "embedder.token_weight", aliases=tied),
            rule("transformer.wpe.weight", "embedder.position_weight"),
        ]
        for i in range(config.num_layers):
            hf, zoo = f"transformer.h.{i}.", f"layers.{i}."
            attention = [f"{zoo}self_attention.{p}_proj" for p in ("query", "key", "value")]
            rules += [
                *weight_and_bias(f"{hf}ln_1", f"{zoo}self_attention_norm"),
                Rule(
                    (f"{hf}attn.c_attn.weight",),
                    tuple(f"{a}.weight" for a in attention),
                    FUSED_QKV_WEIGHT,
                ),
                Rule(
                    (f"{hf}attn.c_attn.bias",),
                    tuple(f"{a}.bias" for a in attention),
                    FUSED_QKV_BIAS,
                ),
                *weight_and_bias(f"{hf}attn.c_proj", f"{zoo}self_attention.output_proj", TRANSPOSE),
                *weight_and_bias(f"{hf}ln_2", f"{zoo}feed_forward_norm"),
                *weight_and_bias(f"{hf}mlp.c_fc", f"{zoo}feed_forward.hidden", TRANSPOSE),
                *weight_and_bias(f"{hf}mlp.c_proj", f"{zoo}feed_forward.output", TRANSPOSE),
            ]
        rules += weight_and_bias("transformer.ln_f", "final_norm")
        if not tie:
            rules.append(rule("lm_head.weight", "head.weight"))
        # the causal-mask buffers older checkpoints carry
        ignore = (r"transformer\.h\.\d+\.attn\.(masked_)?bias",)
        return KeyMap(rules, ignore=ignore)
