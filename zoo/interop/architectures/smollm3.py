"""SmolLM3 (`SmolLM3ForCausalLM`, `SmolLM3Model`) <-> `zoo.GPT`.

Llama's network (`zoo.presets.parts.SMOLLM3`) whose layers differ in their call only:

- `no_rope_layers` (a 1 per layer that rotates, a 0 per NoPE layer; else every
  `no_rope_layer_interval`-th layer is NoPE) becomes an override `attention.rope=None` on the
  NoPE layers;
- with `use_sliding_window`, the layers `layer_types` calls `sliding_attention` (by default the
  NoPE layers, when `sliding_window` is set) see the last `sliding_window` positions: an
  override `attention.window` on those layers.

On export every layer's resolved settings (`config.layers.layers()`) give `no_rope_layers`
and `layer_types` layer by layer; layers that differ in anything else are refused, and so are
rotating layers whose rotary settings differ from one another.
"""

from __future__ import annotations

from typing import Any, ClassVar

from zoo.interop.architecture import (
    ConfigFields,
    HFConfig,
    UnsupportedExport,
    refuse_weight_overrides,
)
from zoo.interop.architectures.gemma import override_of
from zoo.interop.architectures.llama import LlamaFamily
from zoo.interop.files import HFDict
from zoo.models import GPTConfig
from zoo.nn.plan import LayerOverride
from zoo.presets import parts

SLIDING, FULL = "sliding_attention", "full_attention"


class SmolLM3(LlamaFamily):
    name = "smollm3"
    model_type = "smollm3"
    loads = ("SmolLM3ForCausalLM", "SmolLM3Model")
    export_class = "SmolLM3ForCausalLM"
    config_class = "SmolLM3Config"
    zoo_base = parts.with_parts(parts.LLAMA, parts.SMOLLM3)
    has_mlp_bias_option = True
    extra_defaults: ClassVar[dict[str, Any]] = dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        pad_token_id=128004,
        bos_token_id=128000,
        eos_token_id=128001,
        rope_theta=2_000_000.0,
        tie_word_embeddings=True,
        use_sliding_window=False,
        sliding_window=None,
        no_rope_layers=None,
        no_rope_layer_interval=4,
        layer_types=None,
    )

    # -- reading config.json ------------------------------------------------------------------

    def _rotating(self, hf: HFConfig, num_layers: int) -> list[bool]:
        """Whether each layer rotates its queries and keys."""
        flags = hf["no_rope_layers"]
        if flags is None:
            interval = hf["no_rope_layer_interval"]
            if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
                hf.refuse("no_rope_layer_interval", "needs a positive integer")
            return [(i + 1) % interval != 0 for i in range(num_layers)]
        if not isinstance(flags, list) or len(flags) < num_layers or set(flags) - {0, 1}:
            hf.refuse("no_rope_layers", f"needs a 1 or 0 for each of the {num_layers} layers")
        return [bool(flag) for flag in flags[:num_layers]]

    def _sliding(self, hf: HFConfig, rotating: list[bool]) -> list[bool]:
        """Whether each layer sees a sliding window of the last `sliding_window` positions."""
        window = hf["sliding_window"]
        types = hf["layer_types"]
        if types is None:
            types = [
                SLIDING if hf["use_sliding_window"] and window is not None and not rope else FULL
                for rope in rotating
            ]
        if len(types) < len(rotating) or set(types) - {SLIDING, FULL}:
            hf.refuse("layer_types", f"needs {len(rotating)} of {SLIDING!r} and {FULL!r}")
        if not hf["use_sliding_window"]:
            return [False] * len(rotating)  # transformers windows only with use_sliding_window
        sliding = [kind == SLIDING for kind in types[: len(rotating)]]
        if any(sliding) and not isinstance(window, int):
            hf.refuse("sliding_window", "sliding layers need a window of a whole number of tokens")
        return sliding

    def _windows(self, hf: HFConfig, num_layers: int) -> ConfigFields:
        return {}  # SmolLM3's windows come with its NoPE layers, per layer (`_rope`)

    def _rope(self, hf: HFConfig) -> ConfigFields:
        """Llama's rotary on the base block; overrides for the NoPE and the sliding layers."""
        fields = super()._rope(hf)
        num_layers = hf["num_hidden_layers"]
        rotating = self._rotating(hf, num_layers)
        sliding = self._sliding(hf, rotating)
        overrides: list[LayerOverride] = []
        nope = [i for i, rope in enumerate(rotating) if not rope]
        if nope:
            overrides.append(override_of({"attention.rope": None}, nope, num_layers))
        windowed = [i for i, window in enumerate(sliding) if window]
        if windowed:
            changes = {"attention.window": int(hf["sliding_window"])}
            overrides.append(override_of(changes, windowed, num_layers))
        return {**fields, "attention.window": None, "layers.overrides": tuple(overrides)}

    # -- writing config.json -------------------------------------------------------------------

    def check_layers(self, config: GPTConfig) -> None:
        """Layers may differ in their rotary (on or off) and their window, nothing else."""
        refuse_weight_overrides(config, self.export_class)
        base_rope = config.layers.block.attention.rope
        ropes = {s.attention.rope for s in config.layers.layers()} - {None}
        if ropes - {base_rope}:
            raise UnsupportedExport(
                f"{self.export_class} has one rotary setting for the layers that rotate, but "
                f"this model's have {len(ropes)}"
            )

    def _export_window(self, config: GPTConfig) -> HFDict:
        """`no_rope_layers`, `layer_types` and the one `sliding_window`, layer by layer."""
        layers = config.layers.layers()
        windows = sorted({w for s in layers if (w := s.attention.window) is not None})
        if len(windows) > 1:
            raise UnsupportedExport(
                f"{self.export_class} has one sliding_window, but the layers' are {windows}"
            )
        return dict(
            no_rope_layers=[int(s.attention.rope is not None) for s in layers],
            no_rope_layer_interval=self.extra_defaults["no_rope_layer_interval"],
            use_sliding_window=bool(windows),
            sliding_window=windows[0] if windows else None,
            layer_types=[FULL if s.attention.window is None else SLIDING for s in layers],
        )


SMOLLM3 = SmolLM3()

__all__ = ["SMOLLM3", "SmolLM3"]
