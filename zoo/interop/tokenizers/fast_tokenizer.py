"""HuggingFace fast tokenizers (`tokenizer.json`): Llama, Mistral, Qwen, SmolLM2, RoBERTa, XLM-R and
DistilBERT checkpoints.

`tokenizer.json` holds the whole pipeline (normalizer, pre-tokenizer, BPE model, decoder,
post-processor) and is read with the `tokenizers` library alone, without transformers. The
special tokens come from beside it, the way transformers reads them:

- bos, eos, pad, unk, cls, sep and mask token strings (or `{"content": ...}` dicts) from
  `tokenizer_config.json`, with `special_tokens_map.json` filling in the ones it lacks; they are
  resolved to ids through the vocabulary and its added tokens;
- without a bos or eos token there, the `bos_token_id` / `eos_token_id` of
  `generation_config.json`, then of `config.json`;
- every `eos_token_id` of `generation_config.json` and `config.json` (an int or a list) joins
  `eos_ids`, after the tokenizer's own eos;
- a WordPiece (BERT, DistilBERT) tokenizer without bos or eos uses `[CLS]` and `[SEP]` in their
  place, as `HFTokenizer` does: `encode(text, add_bos=True, add_eos=True)` is `[CLS] text [SEP]`.

Checkpoints without a pad token (Llama 3, Mistral) pad with their eos id, so padding is told
apart by length, not by id (as for GPT-2).

The chat template travels with the tokenizer: read from wherever the snapshot keeps it
(`chat_template.jinja` and `additional_chat_templates/NAME.jinja`, `chat_template.json`, or
`tokenizer_config.json`; see `zoo.data.chat.files`), held in `tokenizer_config["chat_template"]`,
and saved as transformers 5 saves it (`chat_template.jinja`, named ones under
`additional_chat_templates/`), so a model saved or exported with its tokenizer keeps its template.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from zoo.data.chat.files import (
    CHAT_TEMPLATE_JINJA,
    CHAT_TEMPLATES_DIR,
    as_templates,
    read_chat_templates,
)
from zoo.data.tokenizers.base import Tokenizer
from zoo.files import JSONObject, JSONValue, TooLarge, write_text_atomic
from zoo.interop.files import CONFIG, INSTALL_HF, json_ids, read_json

if TYPE_CHECKING:
    import tokenizers

TOKENIZER_JSON = "tokenizer.json"
# the largest real ones (a 262,144-token vocabulary with its merges) are some tens of MB
MAX_TOKENIZER_JSON_BYTES = 256 * 2**20
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
GENERATION_CONFIG = "generation_config.json"
ROLES = ("bos", "eos", "pad", "unk", "cls", "sep", "mask")
DOWNLOAD_HINT = (
    "download it with the checkpoint: `huggingface-cli download NAME --include 'tokenizer*' "
    "'special_tokens_map.json' 'generation_config.json' 'config.json' --local-dir DIR`"
)

logger = logging.getLogger("zoo.interop")


class SpecialIds(TypedDict):
    """The special ids of a checkpoint's tokenizer files (`special_ids`)."""

    bos_id: int | None
    eos_ids: list[int]
    pad_token_id: int | None
    unk_id: int | None
    mask_id: int | None


class SavedIds(SpecialIds):
    """What `zoo_tokenizer.json` keeps beside `tokenizer.json` (`FastTokenizer.state`)."""

    adds_bos: bool


class FastTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` (read from `tokenizer.json`) with the checkpoint's special ids.

    `encode` gives the text's ids only (the file's own post-processor, which adds Llama's bos,
    is not applied); `add_bos`/`add_eos` add them as every zoo tokenizer does, and `adds_bos`
    says whether the checkpoint's tokenizer puts bos first (Llama, Mistral: yes; Qwen: no).
    `decode(ids)` stops at the first of `eos_ids` and drops every special token.

    Args:
        tokenizer: the `tokenizers.Tokenizer`.
        bos_id: the beginning-of-sequence id, or None.
        eos_ids: every id that ends a sequence or a turn; the first is the eos id.
        pad_token_id: the checkpoint's padding id, or None (then the eos id pads).
        unk_id: the unknown-token id, or None.
        mask_id: the masked-LM token (`<mask>`, `[MASK]`), or None.
        adds_bos: whether the checkpoint's tokenizer puts bos first.
        tokenizer_config: `tokenizer_config.json`'s contents (chat template, special tokens).
    """

    kind = "tokenizer.json"

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        bos_id: int | None = None,
        eos_ids: Sequence[int] = (),
        pad_token_id: int | None = None,
        unk_id: int | None = None,
        mask_id: int | None = None,
        adds_bos: bool = False,
        tokenizer_config: JSONObject | None = None,
    ):
        self.tokenizer = tokenizer
        self._vocab_size = vocabulary_size(tokenizer)
        self._bos_id, self._eos_ids = bos_id, tuple(eos_ids)
        self.pad_token_id, self._unk_id, self.adds_bos = pad_token_id, unk_id, adds_bos
        self.mask_id = (
            mask_id  # the masked-LM token (`<mask>`, `[MASK]`), if the vocabulary has one
        )
        self.tokenizer_config = tokenizer_config or {}
        added = tokenizer.get_added_tokens_decoder()
        self._added_special = {int(i) for i, token in added.items() if token.special}

    @classmethod
    def from_folder(
        cls, folder: str | os.PathLike, *, start_id: int | None = None
    ) -> FastTokenizer:
        """The tokenizer of a checkpoint folder holding `tokenizer.json` (see the module doc).

        `start_id` becomes the bos id when the files name none: an encoder-decoder's decoder
        start token (T5 starts from its pad id), which targets begin with.
        """
        folder = Path(folder)
        tokenizer = read_tokenizer_json(folder)
        config = read_json(folder / TOKENIZER_CONFIG, missing_ok=True)
        ids = special_ids(tokenizer, folder, config)
        config = with_chat_templates(config, folder)
        if ids["bos_id"] is None:
            ids["bos_id"] = start_id
        adds_bos = config.get("add_bos_token")
        if not isinstance(adds_bos, bool):  # Llama 3: its post-processor adds bos
            with_specials = tokenizer.encode("", add_special_tokens=True).ids
            adds_bos = ids["bos_id"] is not None and with_specials[:1] == [ids["bos_id"]]
        return cls(tokenizer, **ids, adds_bos=adds_bos, tokenizer_config=config)

    @property
    def vocab_size(self) -> int:
        """One past the largest id, added tokens included (the model may have more rows)."""
        return self._vocab_size

    @property
    def puts_bos_first(self) -> bool:
        """`adds_bos`: whether the checkpoint's tokenizer puts bos first."""
        return self.adds_bos

    @property
    def pad_id(self) -> int:
        """The pad token; without one (Llama 3, Mistral), the eos id: mask padding by length."""
        if self.pad_token_id is not None:
            return self.pad_token_id
        if self.eos_id is None:
            raise ValueError(
                f"this tokenizer has neither a pad token nor an eos token to pad with: name one "
                f'in {TOKENIZER_CONFIG} ("pad_token": "<token>") or pass lengths instead of padding'
            )
        return self.eos_id

    @property
    def bos_id(self) -> int | None:
        return self._bos_id

    @property
    def eos_id(self) -> int | None:
        return self._eos_ids[0] if self._eos_ids else None

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self._eos_ids

    @property
    def unk_id(self) -> int | None:
        return self._unk_id

    @property
    def special_ids(self) -> set[int]:
        """pad, bos, every eos, and every added token marked special (`<|im_start|>`, ...)."""
        return {*super().special_ids, *self._eos_ids, *self._added_special}

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def _encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """The tokenizers library encodes a batch in parallel."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [list(encoding.ids) for encoding in encodings]

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    @property
    def chat_template(self) -> str | dict[str, str] | None:
        """The checkpoint's chat template (Jinja text), `{name: text}` for several, or None."""
        found = self.tokenizer_config.get("chat_template")
        return None if found is None else as_templates(found, "the tokenizer's tokenizer_config")

    def save(self, directory: str | os.PathLike) -> Path:
        """`tokenizer.json`, `tokenizer_config.json` and the chat template files (which
        transformers reads too), and `zoo_tokenizer.json` with the special ids."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_text_atomic(directory / TOKENIZER_JSON, self.tokenizer.to_str())
        config = {k: v for k, v in self.tokenizer_config.items() if k != "chat_template"}
        if config:
            text = json.dumps(config, indent=2, ensure_ascii=False)
            write_text_atomic(directory / TOKENIZER_CONFIG, text)
        templates = self.chat_template
        named = {"default": templates} if isinstance(templates, str) else templates or {}
        for name, template in named.items():
            if name == "default":
                write_text_atomic(directory / CHAT_TEMPLATE_JINJA, template)
                continue
            if Path(name).name != name or name in ("", ".", ".."):
                raise ValueError(f"a chat template's name {name!r} is no file name")
            (directory / CHAT_TEMPLATES_DIR).mkdir(exist_ok=True)
            write_text_atomic(directory / CHAT_TEMPLATES_DIR / f"{name}.jinja", template)
        return super().save(directory)

    def state(self) -> JSONObject:
        return {
            "bos_id": self._bos_id,
            "eos_ids": [*self._eos_ids],
            "pad_token_id": self.pad_token_id,
            "unk_id": self._unk_id,
            "mask_id": self.mask_id,
            "adds_bos": self.adds_bos,
        }

    @classmethod
    def from_state(cls, state: JSONObject) -> FastTokenizer:
        raise ValueError(
            f"a FastTokenizer is rebuilt from its folder ({TOKENIZER_JSON} beside the state): "
            "use load_tokenizer(folder)"
        )

    @classmethod
    def from_saved(cls, state: JSONObject, directory: Path | None) -> FastTokenizer:
        if directory is None:
            return cls.from_state(state)
        ids = saved_ids(state)
        config = with_chat_templates(
            read_json(directory / TOKENIZER_CONFIG, missing_ok=True), directory
        )
        return cls(read_tokenizer_json(directory), tokenizer_config=config, **ids)


def saved_ids(state: JSONObject) -> SavedIds:
    """The special ids of a saved state (`FastTokenizer.state`), each checked: an entry of the
    wrong type, or one the state does not have, raises a `TypeError` that names it
    (`load_tokenizer` reports the file as damaged). An absent entry takes its default."""
    unknown = sorted(set(state) - SavedIds.__required_keys__)
    if unknown:
        raise TypeError(f"{', '.join(map(repr, unknown))} (not an entry of this state)")
    eos_ids, adds_bos = state.get("eos_ids", []), state.get("adds_bos", False)
    if not isinstance(eos_ids, list):
        raise TypeError(f"'eos_ids' is {eos_ids!r}, not a list of token ids")
    if not isinstance(adds_bos, bool):
        raise TypeError(f"'adds_bos' is {adds_bos!r}, not true or false")
    return SavedIds(
        bos_id=_saved_optional_id(state, "bos_id"),
        eos_ids=[_saved_id("eos_ids", value) for value in eos_ids],
        pad_token_id=_saved_optional_id(state, "pad_token_id"),
        unk_id=_saved_optional_id(state, "unk_id"),
        mask_id=_saved_optional_id(state, "mask_id"),
        adds_bos=adds_bos,
    )


def _saved_id(name: str, value: JSONValue) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TypeError(f"{name!r} holds {value!r}, not a token id")


def _saved_optional_id(state: JSONObject, name: str) -> int | None:
    value = state.get(name)
    return None if value is None else _saved_id(name, value)


def with_chat_templates(config: JSONObject, folder: Path) -> JSONObject:
    """`config` (a `tokenizer_config.json`) holding the chat template(s) of `folder`, from
    whichever file keeps them (`zoo.data.chat.files.read_chat_templates`)."""
    templates = read_chat_templates(folder)
    if templates is None:
        return config
    if isinstance(templates, str):
        return {**config, "chat_template": templates}
    return {**config, "chat_template": {**templates}}


def read_tokenizer_json(folder: Path) -> tokenizers.Tokenizer:
    """`folder/tokenizer.json` as a `tokenizers.Tokenizer`, with errors that say what to do."""
    try:
        import tokenizers
    except ImportError as error:
        raise ImportError(
            f"the tokenizer in {folder} ({TOKENIZER_JSON}) loads with the tokenizers library: "
            f"{INSTALL_HF}"
        ) from error
    path = folder / TOKENIZER_JSON
    if not path.is_file():
        hint = ""
        if (folder / "tokenizer.model").is_file():
            hint = (
                "; or write it from tokenizer.model once with transformers: "
                "`AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)`"
            )
        raise FileNotFoundError(f"{folder} has no {TOKENIZER_JSON}: {DOWNLOAD_HINT}{hint}")
    if path.stat().st_size > MAX_TOKENIZER_JSON_BYTES:  # read whole by the library
        raise TooLarge(
            f"{path} refused: it holds {path.stat().st_size:,} bytes, more than the "
            f"{MAX_TOKENIZER_JSON_BYTES:,} zoo reads of a {TOKENIZER_JSON}; a real one is far "
            "smaller, so check that it is the file you meant"
        )
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as error:  # the Rust side raises a bare Exception
        raise ValueError(
            f"{path} is damaged: the tokenizers library cannot read it ({error}); {DOWNLOAD_HINT}"
        ) from error


def special_ids(tokenizer: tokenizers.Tokenizer, folder: Path, config: JSONObject) -> SpecialIds:
    """`bos_id`, `eos_ids`, `pad_token_id`, `unk_id`, `mask_id` of the checkpoint in `folder`
    (see the module doc); `config` is its `tokenizer_config.json`."""
    tokens = {
        **_token_texts(read_json(folder / SPECIAL_TOKENS_MAP, missing_ok=True)),
        **_token_texts(config),
    }
    ids = {role: _token_id(tokenizer, tokens.get(role), role, folder) for role in ROLES}
    model_configs = {
        path: read_json(path, missing_ok=True)
        for path in (folder / GENERATION_CONFIG, folder / CONFIG)
    }
    bos_ids = _ids([ids["bos"]])
    if "bos" not in tokens:  # Qwen's `"bos_token": null` means none, whatever config.json says
        bos_ids = _config_ids(model_configs, "bos_token_id")[:1]
    eos_ids = [*_ids([ids["eos"]]), *_config_ids(model_configs, "eos_token_id")]
    if not bos_ids and "bos" not in tokens:  # WordPiece: [CLS] opens a sequence
        bos_ids = _ids([ids["cls"]])
    if not eos_ids:  # and [SEP] closes it
        eos_ids = _ids([ids["sep"]])
    size = vocabulary_size(tokenizer)
    return SpecialIds(
        bos_id=next(iter(_inside(bos_ids, size, "bos_token_id", folder)), None),
        eos_ids=_inside(list(dict.fromkeys(eos_ids)), size, "eos_token_id", folder),
        pad_token_id=ids["pad"],
        unk_id=ids["unk"],
        mask_id=ids["mask"],
    )


def _token_texts(config: JSONObject) -> dict[str, JSONValue]:
    """`{role: token text or None}` for the roles `config` names (`"bos_token": ...`)."""
    found: dict[str, JSONValue] = {}
    for role in ROLES:
        if f"{role}_token" in config:
            value = config[f"{role}_token"]
            found[role] = value.get("content") if isinstance(value, dict) else value
    return found


def _token_id(
    tokenizer: tokenizers.Tokenizer, text: JSONValue, role: str, folder: Path
) -> int | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError(
            f'{folder}: {role}_token should be a token string or {{"content": "<token>"}}, '
            f"found {text!r}"
        )
    token_id = tokenizer.token_to_id(text)
    if token_id is None:
        raise ValueError(
            f"{folder}: the {role} token {text!r} named in {TOKENIZER_CONFIG} or "
            f"{SPECIAL_TOKENS_MAP} is neither in the vocabulary of {TOKENIZER_JSON} nor among "
            f"its added tokens; correct {role}_token to a token of {TOKENIZER_JSON} (or add "
            "it there), or check that the files belong to the same checkpoint"
        )
    return int(token_id)


def _config_ids(configs: dict[Path, JSONObject], name: str) -> list[int]:
    """The ids `name` holds in `configs` (each file's an int, a list of ints or absent), in
    order; an entry of another type names its file as damaged."""
    found: list[int] = []
    for path, config in configs.items():
        found += json_ids(config.get(name), name, path)
    return found


def _ids(values: Sequence[int | None]) -> list[int]:
    return [int(value) for value in values if value is not None]


def _inside(ids: list[int], size: int, name: str, folder: Path) -> list[int]:
    """`ids` inside the vocabulary; the others are left out with a warning."""
    for value in ids:
        if not 0 <= value < size:
            logger.warning(
                "%s: %s %d is outside the vocabulary [0, %d); left out", folder, name, value, size
            )
    return [value for value in ids if 0 <= value < size]


def vocabulary_size(tokenizer: tokenizers.Tokenizer) -> int:
    """One past the largest id of a `tokenizers.Tokenizer`, added tokens included."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1
