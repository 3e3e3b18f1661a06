"""OLMo 3 (`Olmo3ForCausalLM`, `Olmo3Model`) <-> `zoo.GPT`.

OLMo 2's parts (`zoo.presets.parts.OLMO3`: norms on the sub-layer outputs, QK-norm over the
whole projections) with two kinds of layer, named by `layer_types` (by default three
`sliding_attention` layers, then a `full_attention` one):

- the sliding layers see the last `sliding_window` positions: the base block's
  `attention.window`, with their own rotary settings (`rope_parameters["sliding_attention"]`);
- the full layers attend to every position, with theirs (`rope_parameters["full_attention"]`):
  an override `attention.window=None` with their `attention.rope`.

The hub's config files give `rope_theta` and `rope_scaling`: the base goes to both kinds, the
scaling (the 7B's YaRN) to the full layers only. (transformers 5 reads that spelling with its
default base, 500000, for the sliding layers whatever `rope_theta` says; the published
checkpoints use 500000, so the two agree on them. A warning says so for another base.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from zoo.interop.architecture import (
    ConfigFields,
    HFConfig,
    UnsupportedExport,
    logger,
    refuse_weight_overrides,
)
from zoo.interop.architectures.gemma import override_of
from zoo.interop.architectures.olmo2 import Olmo2
from zoo.interop.files import HFDict
from zoo.models import GPTConfig
from zoo.nn.rotary import Rope
from zoo.presets import parts

SLIDING, FULL = "sliding_attention", "full_attention"


class Olmo3(Olmo2):
    name = "olmo3"
    model_type = "olmo3"
    loads = ("Olmo3ForCausalLM", "Olmo3Model")
    export_class = "Olmo3ForCausalLM"
    config_class = "Olmo3Config"
    zoo_base = parts.with_parts(parts.LLAMA, parts.OLMO3)
    extra_defaults: ClassVar[dict[str, Any]] = dict(
        Olmo2.extra_defaults, rope_theta=500000.0, sliding_window=4096, layer_types=None
    )

    # -- reading config.json ------------------------------------------------------------------

    def _layer_types(self, hf: HFConfig, num_layers: int) -> list[str]:
        types = hf["layer_types"]
        if types is None:
            return [FULL if (i + 1) % 4 == 0 else SLIDING for i in range(num_layers)]
        if not isinstance(types, list) or len(types) < num_layers or set(types) - {SLIDING, FULL}:
            hf.refuse("layer_types", f"needs {num_layers} of {SLIDING!r} and {FULL!r}")
        return list(types[:num_layers])

    def _rope_of(self, hf: HFConfig, params: Mapping[str, Any]) -> Rope:
        params = {k: v for k, v in params.items() if k != "truncate"}  # transformers reads none
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            hf.refuse("rope_parameters", "OLMo 3 rotates the whole head")
        try:
            return Rope.from_hf(params)
        except ValueError as error:
            hf.refuse("rope_parameters", str(error))
            raise  # unreachable: refuse raises

    def _ropes(self, hf: HFConfig) -> dict[str, Rope]:
        """Each layer kind's rotary settings, from either spelling."""
        theta = hf["rope_theta"] if hf["rope_theta"] is not None else 500000.0
        params = hf["rope_parameters"]
        if params is None:
            if theta != 500000.0:
                logger.warning(
                    "olmo3: both layer kinds rotate by rope_theta=%s, as the checkpoint's own "
                    "code does; transformers 5 reads this spelling with 500000 for the sliding "
                    "layers",
                    theta,
                )
            full = {"rope_type": "default", **(hf["rope_scaling"] or {})}
            by_kind: dict[str, Mapping[str, Any]] = {FULL: full, SLIDING: {"rope_type": "default"}}
        elif isinstance(params, Mapping) and set(params) <= {FULL, SLIDING}:
            by_kind = {
                kind: params.get(kind) or {"rope_type": "default"} for kind in (FULL, SLIDING)
            }
        else:
            hf.refuse("rope_parameters", f"OLMo 3 gives one per layer kind ({FULL}, {SLIDING})")
        return {
            kind: self._rope_of(hf, {"rope_theta": theta, **kind_params})
            for kind, kind_params in by_kind.items()
        }

    def _windows(self, hf: HFConfig, num_layers: int) -> ConfigFields:
        return {}  # OLMo 3's windows come with its rotary settings, per layer kind (`_rope`)

    def _rope(self, hf: HFConfig) -> ConfigFields:
        """The sliding layers' window and rotary on the base block, an override for the full
        layers (no window, their own rotary)."""
        num_layers = hf["num_hidden_layers"]
        types = self._layer_types(hf, num_layers)
        ropes = self._ropes(hf)
        full = [i for i, kind in enumerate(types) if kind == FULL]
        if len(full) == num_layers:
            return {"attention.window": None, "attention.rope": ropes[FULL], "layers.overrides": ()}
        window = hf["sliding_window"]
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            hf.refuse("sliding_window", "sliding layers need a window of a whole number of tokens")
        fields: ConfigFields = {
            "attention.window": window,
            "attention.rope": ropes[SLIDING],
            "layers.overrides": (),
        }
        if full:
            changes: dict[str, object] = {"attention.window": None}
            if ropes[FULL] != ropes[SLIDING]:
                changes["attention.rope"] = ropes[FULL]
            fields["layers.overrides"] = (override_of(changes, full, num_layers),)
        return fields

    # -- writing config.json -------------------------------------------------------------------

    def check_layers(self, config: GPTConfig) -> None:
        """Layers may differ in their window and rotary settings, nothing else."""
        refuse_weight_overrides(config, self.export_class)

    def hf_config(self, config: GPTConfig) -> HFDict:
        out = super().hf_config(config)
        del out["rope_theta"], out["rope_scaling"]  # one per layer kind instead
        return out

    def _export_window(self, config: GPTConfig) -> HFDict:
        """`layer_types`, the one `sliding_window` and each kind's `rope_parameters`."""
        layers = config.layers.layers()
        kinds = [SLIDING if s.attention.window is not None else FULL for s in layers]
        windows = sorted({w for s in layers if (w := s.attention.window) is not None})
        if len(windows) > 1:
            raise UnsupportedExport(
                f"{self.export_class} has one sliding_window, but the layers' are {windows}"
            )
        params: dict[str, dict[str, object]] = {}
        for kind in (FULL, SLIDING):
            ropes = {s.attention.rope for s, k in zip(layers, kinds, strict=True) if k == kind}
            if None in ropes:
                raise UnsupportedExport(
                    f"{self.export_class} rotates queries and keys in every layer: "
                    "attention.rope=None on some layers"
                )
            if len(ropes) > 1:
                raise UnsupportedExport(
                    f"{self.export_class} has one rotary setting for the {kind} layers, but "
                    f"this model's {kind} layers have {len(ropes)}"
                )
            rope = ropes.pop() if ropes else config.layers.block.attention.rope
            assert rope is not None  # Llama's hf_config refuses a base block without
            theta, scaling = rope.to_hf()
            params[kind] = {"rope_type": "default", **(scaling or {}), "rope_theta": theta}
        return dict(
            layer_types=kinds,
            sliding_window=windows[0] if windows else config.max_positions,
            rope_parameters=params,
        )


OLMO3 = Olmo3()

__all__ = ["OLMO3", "Olmo3"]
