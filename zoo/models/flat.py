"""Configs written before the tree (zoo 0.1): one flat record of every part's fields.

A run folder or `config.json` of 0.1 holds the flat fields (`num_heads`, `sliding_window`,
`global_layers`, `num_experts`, ...). `config_from_flat` reads them as 0.1 did, with 0.1's
defaults for fields a config of its time did not write, and builds today's tree: the same
model, the same weights' paths. `unknown_name` turns a flat name given to `replace` (or
`--set`, or `zoo.create`) into an error that names its path in the tree.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence

from zoo.nn.block import BlockSettings
from zoo.nn.rotary import Rope
from zoo.records import R, from_data, replace_paths

# 0.1's fields every flavor had, with their defaults
SHARED: dict[str, object] = dict(
    vocab_size=32000, d_model=512, num_heads=8, num_kv_heads=None, attention_head_dim=None,
    num_layers=6, d_ff=2048, feed_forward="dense", max_positions=512, pad_id=0, dropout=0.1,
    attention_dropout=0.1, activation_dropout=None, activation="gelu", norm="layernorm",
    norm_first=True, layer_norm_eps=1e-5, use_bias=True, qkv_bias=None,
    attention_output_bias=None, feed_forward_bias=None, qk_norm=False, scale_scores=True,
    sliding_window=None, global_layers=None, local_rope_theta=None, output_norm=False,
    norm_weight_offset=0.0, norm_bias=True, first_attention_norm=True, qk_norm_scope="head",
    query_pre_attn_scalar=None, attention_softcap=None, positions="learned", rope=None,
    sinusoid_layout="interleaved", scale_embeddings=False, embedding_norm=False, init_std=0.02,
    layer_loop="auto", attention_implementation=None, remat=None, dtype="float32",
    num_experts=0, num_experts_per_tok=2, moe_intermediate_size=None,
    shared_expert_intermediate_size=0, norm_topk_prob=True, router="softmax",
    router_aux_loss_coef=0.0, router_z_loss_coef=0.0, moe_implementation="ragged",
    mlp_only_layers=(), decoder_sparse_step=1, first_k_dense_replace=0,
)  # fmt: skip
# each flavor's own fields and other defaults
FLAVOR: dict[str, dict[str, object]] = {
    "GPTConfig": dict(
        vocab_size=50257, d_model=768, num_heads=12, num_layers=12, d_ff=3072,
        max_positions=1024, pad_id=None, activation="gelu_tanh", bos_id=None, eos_id=None,
        stop_ids=(), tie_embeddings=True, final_logit_softcap=None,
    ),
    "ClassifierConfig": dict(
        vocab_size=30522, d_model=768, num_heads=12, num_layers=12, d_ff=3072, norm_first=False,
        layer_norm_eps=1e-12, embedding_norm=True, num_classes=2, pooling="first", pooler=True,
        pooler_activation="tanh", pooler_bias=True, pooler_norm=False, position_offset=0,
        masked_lm=False, mask_id=None, type_vocab_size=2, classifier_dropout=None,
    ),
    "TranslatorConfig": dict(
        vocab_size=37000, max_positions=1024, activation="relu", norm_first=False,
        positions="sinusoidal", scale_embeddings=True, target_vocab_size=None,
        num_decoder_layers=None, bos_id=1, eos_id=2, share_embeddings=True, tie_output=True,
        output_bias=False, scale_output=False, final_dropout=False, relative_buckets=32,
        relative_max_distance=128,
    ),
}  # fmt: skip
# model-level fields that kept their name
KEPT = ("vocab_size", "d_model", "max_positions", "pad_id", "dtype", "init_std", "layer_loop")
KEPT_BY_FLAVOR = {
    "GPTConfig": ("bos_id", "eos_id", "stop_ids"),
    "ClassifierConfig": ("masked_lm", "mask_id"),
    "TranslatorConfig": ("target_vocab_size", "share_embeddings", "bos_id", "eos_id"),
}

# a flat name -> where it lives in the tree (short block paths), for the error of `replace`
RENAMED = {
    "num_kv_heads": "attention.num_kv_heads", "attention_head_dim": "attention.head_dim",
    "qkv_bias": "attention.qkv_bias", "attention_output_bias": "attention.output_bias",
    "qk_norm": "attention.qk_norm", "qk_norm_scope": "attention.qk_norm.scope",
    "scale_scores": "attention.scale_dim", "query_pre_attn_scalar": "attention.scale_dim",
    "attention_softcap": "attention.softcap", "sliding_window": "attention.window",
    "attention_implementation": "attention.implementation", "rope": "attention.rope",
    "positions": "embedder.positions (and attention.rope)", "feed_forward": "feed_forward.kind",
    "activation": "feed_forward.activation", "activation_dropout": "feed_forward.dropout",
    "feed_forward_bias": "feed_forward.bias", "use_bias": "attention.qkv_bias, "
    "attention.output_bias and feed_forward.bias", "norm": "norm.kind",
    "layer_norm_eps": "norm.eps", "norm_weight_offset": "norm.weight_offset",
    "norm_bias": "norm.bias", "norm_first": "norm_first", "output_norm": "output_norm",
    "sinusoid_layout": "embedder.sinusoid_layout", "scale_embeddings": "embedder.scale",
    "embedding_norm": "embedder.norm", "type_vocab_size": "embedder.type_vocab_size",
    "position_offset": "embedder.position_offset", "num_experts": "feed_forward "
    "(a zoo.nn.MoESettings)", "num_experts_per_tok": "feed_forward.top_k",
    "moe_intermediate_size": "feed_forward.d_ff",
    "shared_expert_intermediate_size": "feed_forward.shared_d_ff",
    "norm_topk_prob": "feed_forward.normalize_top_k", "router": "feed_forward.router",
    "router_aux_loss_coef": "feed_forward.aux_loss_coef",
    "router_z_loss_coef": "feed_forward.z_loss_coef",
    "moe_implementation": "feed_forward.implementation",
    "global_layers": "layers.overrides", "local_rope_theta": "layers.overrides",
    "mlp_only_layers": "layers.overrides", "decoder_sparse_step": "layers.overrides",
    "first_k_dense_replace": "layers.overrides", "first_attention_norm": "layers.overrides",
    "tie_embeddings": "head.tie", "final_logit_softcap": "head.softcap",
    "pooling": "head.pooling", "pooler": "head.pooler", "pooler_activation":
    "head.pooler.activation", "pooler_bias": "head.pooler.bias", "pooler_norm":
    "head.pooler.norm", "classifier_dropout": "head.dropout", "tie_output": "head.tie",
    "output_bias": "head.bias", "scale_output": "head.scale",
    "num_decoder_layers": "decoder.num_layers", "relative_buckets": "relative.num_buckets",
    "relative_max_distance": "relative.max_distance",
}  # fmt: skip


# the 0.1 names whose value is one field of the tree, and that field: what `--set NAME=VALUE`
# of a run started under 0.1 means when the run is resumed by the command that started it
ONE_FIELD = {
    "num_kv_heads": "attention.num_kv_heads", "attention_head_dim": "attention.head_dim",
    "qkv_bias": "attention.qkv_bias", "attention_output_bias": "attention.output_bias",
    "attention_softcap": "attention.softcap", "sliding_window": "attention.window",
    "attention_implementation": "attention.implementation", "feed_forward": "feed_forward.kind",
    "activation": "feed_forward.activation", "activation_dropout": "feed_forward.dropout",
    "feed_forward_bias": "feed_forward.bias", "norm": "norm.kind", "layer_norm_eps": "norm.eps",
    "norm_weight_offset": "norm.weight_offset", "norm_bias": "norm.bias",
    "sinusoid_layout": "embedder.sinusoid_layout", "scale_embeddings": "embedder.scale",
    "type_vocab_size": "embedder.type_vocab_size", "position_offset": "embedder.position_offset",
    "num_experts_per_tok": "feed_forward.top_k", "moe_intermediate_size": "feed_forward.d_ff",
    "router_aux_loss_coef": "feed_forward.aux_loss_coef",
    "router_z_loss_coef": "feed_forward.z_loss_coef", "tie_embeddings": "head.tie",
    "final_logit_softcap": "head.softcap", "pooling": "head.pooling",
    "classifier_dropout": "head.dropout", "num_decoder_layers": "decoder.num_layers",
    "tie_output": "head.tie", "output_bias": "head.bias", "scale_output": "head.scale",
}  # fmt: skip


def renamed_setting(setting: str) -> str:
    """A `--set NAME=VALUE` of zoo 0.1 in the tree's spelling (`num_kv_heads=1` ->
    `attention.num_kv_heads=1`); any other setting as it is."""
    name, separator, value = setting.partition("=")
    path = ONE_FIELD.get(name.strip())
    return f"{path}{separator}{value}" if path is not None and separator else setting


def unknown_name(
    cls: type, name: str, aliases: tuple[str, ...], flavors: Sequence[type] = ()
) -> ValueError:
    """The error for a name `replace` does not know: its place in the tree if it is a flat
    name of 0.1, the flavors among `flavors` that have it, else the closest names."""
    if name in RENAMED:
        return ValueError(
            f"{cls.__name__} has no field {name!r}: since 0.2 the config is the tree of its "
            f"parts' settings, and {name} is {RENAMED[name]} (a short path such as "
            "'attention.num_kv_heads' changes every block; see docs/configs.md)"
        )
    first = name.split(".")[0]
    owners = [
        flavor
        for flavor in flavors
        if flavor is not cls and first in {one.name for one in dataclasses.fields(flavor)}
    ]
    if owners:
        models = " and ".join(f"zoo.{owner.__name__.removesuffix('Config')}" for owner in owners)
        return ValueError(
            f"{cls.__name__} has no field {name!r}: it is a field of "
            f"{' and '.join(owner.__name__ for owner in owners)}, implemented for {models} "
            f"only, not {cls.__name__}"
        )
    fields = [field.name for field in dataclasses.fields(cls)]
    blocks = [f"{field.name}." for field in dataclasses.fields(BlockSettings)]
    close = difflib.get_close_matches(name, [*fields, *aliases, *blocks], n=3)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return ValueError(
        f"{cls.__name__} has no field {name!r}{hint} (its fields: {', '.join(fields)}; flat "
        f"names: {', '.join(aliases)}; or a short path into a block: attention.*, "
        "feed_forward.*, norm.*)"
    )


def _older(data: Mapping[str, object]) -> dict[str, object]:
    """Fields of even older configs in 0.1's form: `scan_layers` (true was the default, so it
    means "auto") became `layer_loop`; flat `rope_*` fields and a `rope` dict one `Rope`."""
    fields = dict(data)
    if "scan_layers" in fields:
        fields["layer_loop"] = "auto" if fields.pop("scan_layers") else "unroll"
    names = {f"rope_{one.name}": one.name for one in dataclasses.fields(Rope)}
    flat = {names[name]: fields.pop(name) for name in list(fields) if name in names}
    given = fields.get("rope")
    base = from_data(Rope, given) if isinstance(given, Mapping) else (given or Rope())
    if not isinstance(base, Rope):
        raise ValueError(f"rope must be a rotary settings object, got {given!r}")
    fields["rope"] = replace_paths(base, flat)
    return fields


def _fields(cls_name: str, data: Mapping[str, object]) -> dict[str, object]:
    """The flat fields of one 0.1 config, with 0.1's defaults for those it lacks."""
    defaults = {**SHARED, **FLAVOR[cls_name]}
    given = _older(data)
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(f"unknown {cls_name} field(s) {unknown} in a 0.1 config")
    return {**defaults, **given}


def _int(fields: Mapping[str, object], name: str) -> int:
    value = fields[name]
    if not isinstance(value, int):
        raise ValueError(f"{name} must be an integer in a 0.1 config, got {value!r}")
    return value


def _layers(fields: Mapping[str, object], name: str) -> tuple[int, ...]:
    value = fields[name]
    if not isinstance(value, list | tuple) or not all(isinstance(i, int) for i in value):
        raise ValueError(f"{name} must list layer numbers in a 0.1 config, got {value!r}")
    return tuple(value)


def _attention(
    f: Mapping[str, object], *, windowed: bool, cross: bool = False
) -> dict[str, object]:
    """The attention's settings, as 0.1 resolved them from the flat fields."""

    def resolved(name: str) -> object:
        return f["use_bias"] if f[name] is None else f[name]

    qk_norm = None
    if f["qk_norm"]:
        qk_norm = dict(
            scope=f["qk_norm_scope"], eps=f["layer_norm_eps"], weight_offset=f["norm_weight_offset"]
        )
    scale_dim = f["query_pre_attn_scalar"] if f["scale_scores"] else 1.0
    rotary = f["positions"] == "rotary" and not cross
    return dict(
        num_heads=f["num_heads"],
        num_kv_heads=f["num_kv_heads"],
        head_dim=f["attention_head_dim"],
        qkv_bias=resolved("qkv_bias"),
        output_bias=resolved("attention_output_bias"),
        qk_norm=qk_norm,
        dropout=f["attention_dropout"],
        implementation=f["attention_implementation"],
        scale_dim=scale_dim,
        softcap=f["attention_softcap"],
        rope=f["rope"] if rotary else None,
        window=f["sliding_window"] if windowed else None,
    )


def _feed_forwards(f: Mapping[str, object]) -> tuple[dict[str, object], dict[str, object] | None]:
    """(the dense feed-forward's settings, the experts' or None)."""
    dropout = f["dropout"] if f["activation_dropout"] is None else f["activation_dropout"]
    dense = dict(
        type="FeedForwardSettings",
        d_ff=f["d_ff"],
        activation=f["activation"],
        kind=f["feed_forward"],
        bias=f["use_bias"] if f["feed_forward_bias"] is None else f["feed_forward_bias"],
        dropout=dropout,
    )
    if not f["num_experts"]:
        return dense, None
    width = f["moe_intermediate_size"]
    experts = dict(
        type="MoESettings",
        num_experts=f["num_experts"],
        top_k=f["num_experts_per_tok"],
        d_ff=f["d_ff"] if width is None else width,
        shared_d_ff=f["shared_expert_intermediate_size"],
        normalize_top_k=f["norm_topk_prob"],
        router=f["router"],
        activation=f["activation"],
        aux_loss_coef=f["router_aux_loss_coef"],
        z_loss_coef=f["router_z_loss_coef"],
        implementation=f["moe_implementation"],
    )
    return dense, experts


def _plan(
    f: Mapping[str, object], num_layers: int, *, decoder: bool, windowed: bool
) -> dict[str, object]:
    """A plan of 0.1's blocks: experts where 0.1 routed, its dense layers among them, the
    first layer without an attention norm, its global layers among windowed ones."""
    dense, experts = _feed_forwards(f)
    norm = dict(
        kind=f["norm"],
        eps=f["layer_norm_eps"],
        weight_offset=f["norm_weight_offset"],
        bias=f["norm_bias"],
    )
    attention = _attention(f, windowed=windowed)
    block = dict(
        attention=attention,
        feed_forward=experts or dense,
        cross_attention=_attention(f, windowed=False, cross=True) if decoder else None,
        norm=norm,
        norm_first=f["norm_first"],
        dropout=f["dropout"],
        output_norm=f["output_norm"],
    )
    overrides: list[dict[str, object]] = []
    if experts is not None:
        step, first = _int(f, "decoder_sparse_step"), _int(f, "first_k_dense_replace")
        only = _layers(f, "mlp_only_layers")
        dense_layers = [
            i for i in range(num_layers) if i in only or (i + 1) % step != 0 or i < first
        ]
        if dense_layers:
            overrides.append(dict(changes={"feed_forward": dense}, layers=dense_layers))
    if not f["first_attention_norm"]:
        overrides.append(dict(changes={"attention_norm": False}, layers=[0]))
    if f["global_layers"] is not None:
        global_layers = _layers(f, "global_layers")
        local = f["local_rope_theta"]
        rotary = f["positions"] == "rotary"
        if isinstance(local, int | float) and rotary:  # the base block is local: its own base
            attention["rope"] = Rope(theta=float(local))
        changes: dict[str, object] = {"attention.window": None}
        if local is not None and rotary:
            changes["attention.rope"] = f["rope"]
        overrides.append(dict(changes=changes, layers=list(global_layers)))
    return dict(block=block, num_layers=num_layers, overrides=overrides)


def config_from_flat(cls: type[R], data: Mapping[str, object]) -> R:
    """The config of class `cls` that a 0.1 flat config (`data`) describes."""
    kind = cls.__name__
    if kind not in FLAVOR:
        raise ValueError(f"a 0.1 config is a GPT, classifier or translator config, not {kind}")
    f = _fields(kind, data)
    count = _int(f, "num_layers")
    positions = f["positions"]
    embedder: dict[str, object] = dict(
        positions=positions if positions in ("learned", "sinusoidal") else "none",
        sinusoid_layout=f["sinusoid_layout"],
        scale=f["scale_embeddings"],
        norm=dict(kind="layernorm", eps=f["layer_norm_eps"], bias=f["norm_bias"])
        if f["embedding_norm"]
        else None,
        dropout=f["dropout"],
    )
    tree: dict[str, object] = {name: f[name] for name in (*KEPT, *KEPT_BY_FLAVOR[kind])}
    tree.update(remat=f["remat"], embedder=embedder)
    windowed = kind != "TranslatorConfig"
    tree["layers"] = _plan(f, count, decoder=False, windowed=windowed)
    if kind == "GPTConfig":
        tree["head"] = dict(tie=f["tie_embeddings"], softcap=f["final_logit_softcap"])
    elif kind == "ClassifierConfig":
        embedder.update(type_vocab_size=f["type_vocab_size"], position_offset=f["position_offset"])
        pooler = dict(
            activation=f["pooler_activation"], bias=f["pooler_bias"], norm=f["pooler_norm"]
        )
        head_dropout = f["classifier_dropout"]
        tree["head"] = dict(
            num_classes=f["num_classes"],
            pooling=f["pooling"],
            pooler=pooler if f["pooler"] else None,
            dropout=f["dropout"] if head_dropout is None else head_dropout,
        )
    else:
        decoders = f["num_decoder_layers"]
        decoder_count = count if decoders is None else _int(f, "num_decoder_layers")
        tree["decoder"] = _plan(f, decoder_count, decoder=True, windowed=False)
        tree["head"] = dict(tie=f["tie_output"], bias=f["output_bias"], scale=f["scale_output"])
        tree["final_dropout"] = f["final_dropout"]
        if positions == "relative":
            tree["relative"] = dict(
                num_buckets=f["relative_buckets"], max_distance=f["relative_max_distance"]
            )
    return from_data(cls, tree)
