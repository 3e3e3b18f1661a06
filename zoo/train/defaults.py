"""Training defaults per preset: what `zoo train` uses for the options the user leaves out.

A table and nothing else: the `*-small` rows are the settings of the measured CPU runs in
`docs/results.md`; any other preset falls back to its flavor's row. `zoo train` fills the options
left out from `training_defaults` (explicit command-line options always win).
"""

from __future__ import annotations

# a default: a number, a name, a switch, or None (decided elsewhere, e.g. by the task)
Default = int | float | str | bool | None
Row = dict[str, Default]

# Options `zoo train` reads through `training_defaults`, and their values for an unknown preset.
BASE: Row = {
    "steps": 1000,  # optimizer updates
    "batch_size": 32,  # examples (language modelling: blocks) per batch
    "lr": 1e-3,  # peak learning rate
    "schedule": "inverse_sqrt",  # inverse_sqrt | cosine | constant
    "warmup": 100,  # linear warmup steps
    "weight_decay": 0.01,  # AdamW decay on weight matrices
    "eval_every": None,  # None: evaluate at the end only
    "label_smoothing": 0.0,  # translator only
    "max_len": None,  # None: the model's max_positions
    "min_freq": None,  # word tokenizer minimum count (None: the tokenizer's default)
    "lowercase": False,  # word tokenizer: lowercase the text
    "tokenizer": None,  # None: the task's default (word; char for language modelling)
}

FLAVOR_DEFAULTS: dict[str, Row] = {
    "classifier": {},
    "gpt": {"tokenizer": "char"},
    "translator": {"label_smoothing": 0.1},
}

PRESET_DEFAULTS: dict[str, Row] = {
    "classifier-small": {
        "steps": 800,
        "batch_size": 32,
        "lr": 1e-3,
        "schedule": "cosine",
        "warmup": 100,
        "weight_decay": 0.1,
        "eval_every": 200,
        "max_len": 64,
        "min_freq": 2,
        "lowercase": True,
    },
    "translator-small": {
        "steps": 4000,
        "batch_size": 64,
        "lr": 1e-3,
        "schedule": "inverse_sqrt",
        "warmup": 400,
        "eval_every": 500,
        "label_smoothing": 0.1,
        "max_len": 64,
        "min_freq": 2,
    },
    "gpt-small": {
        "steps": 1600,
        "batch_size": 32,
        "lr": 3e-3,
        "schedule": "cosine",
        "warmup": 100,
        "weight_decay": 0.1,
        "eval_every": 400,
        "max_len": 128,
        "tokenizer": "char",
    },
}


def training_defaults(preset: str, flavor: str) -> Row:
    """The defaults for `preset` (a flavor's row for presets without their own)."""
    return BASE | FLAVOR_DEFAULTS.get(flavor, {}) | PRESET_DEFAULTS.get(preset, {})
