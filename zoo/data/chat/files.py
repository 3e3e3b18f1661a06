"""Where a model's chat template comes from: its checkpoint folder, its tokenizer, or zoo's default.

A hub snapshot keeps the template in one of these places, read in this order (as transformers
reads them, the newest layout first):

| file | holds |
| --- | --- |
| `chat_template.jinja` (+ `additional_chat_templates/NAME.jinja`) | the template text itself (the default one, and named ones) |
| `chat_template.json` | `{"chat_template": ...}`, the layout processors used to save |
| `tokenizer_config.json` | `"chat_template"`: one template, or a list of `{"name", "template"}` |

A set of named templates resolves to the one asked for by name, to `tool_use` when tools are
given and it exists, else to `default`. A model with none of these (gpt2, a zoo model trained
from scratch) gets `DEFAULT_TEMPLATE`, and the log says so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from zoo.data.chat.template import DEFAULT_TEMPLATE, MAX_TEMPLATE_CHARS, ChatTemplate
from zoo.data.tokenizers.base import Tokenizer
from zoo.files import JSONObject, damaged, read_bounded, read_json_object

DAMAGED_FIX = "copy the tokenizer's files again from the checkpoint they came from"
CHAT_TEMPLATE_JINJA = "chat_template.jinja"
CHAT_TEMPLATES_DIR = "additional_chat_templates"  # transformers' name for named templates
CHAT_TEMPLATE_JSON = "chat_template.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
# The special token strings transformers passes to a template (its `special_tokens_map`).
TOKEN_ROLES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")

logger = logging.getLogger(__name__)

Templates = str | dict[str, str]


def read_chat_templates(folder: str | os.PathLike) -> Templates | None:
    """The chat template(s) of the checkpoint in `folder` (see the module table), or None."""
    folder = Path(folder)
    named = {}
    if (folder / CHAT_TEMPLATE_JINJA).is_file():
        named["default"] = _read_template(folder / CHAT_TEMPLATE_JINJA)
    if (folder / CHAT_TEMPLATES_DIR).is_dir():
        for path in sorted((folder / CHAT_TEMPLATES_DIR).glob("*.jinja")):
            named[path.stem] = _read_template(path)
    if named:
        return named["default"] if list(named) == ["default"] else named
    for name in (CHAT_TEMPLATE_JSON, TOKENIZER_CONFIG):
        found = _optional_json(folder / name).get("chat_template")
        if found is not None:
            return as_templates(found, folder / name)
    return None


def _read_template(path: Path) -> str:
    """A template file's text; one that is not UTF-8 is named as damaged."""
    # up to 4 bytes a character; the template's length is then checked where it is compiled
    data = read_bounded(path, 4 * MAX_TEMPLATE_CHARS, "a chat template")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise damaged(
            path,
            f"not UTF-8 text: byte {error.object[error.start]:#04x} at offset {error.start}",
            "save the template as UTF-8, or delete it to use the tokenizer's own",
        ) from None


def as_templates(value: object, where: str | os.PathLike) -> Templates:
    """A `chat_template` value (a string, or a list of `{"name", "template"}`) checked."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and all(isinstance(v, str) for v in value.values()):
        return dict(value)
    if isinstance(value, list) and all(
        isinstance(item, Mapping) and isinstance(item.get("name"), str)
        and isinstance(item.get("template"), str)
        for item in value
    ):  # fmt: skip
        return {item["name"]: item["template"] for item in value}
    raise ValueError(
        f"{where}: chat_template should be a template string or a list of "
        f'{{"name": ..., "template": ...}}, found {type(value).__name__}'
    )


def pick_template(templates: Templates, *, name: str | None = None, tools: bool = False) -> str:
    """One template out of `templates`: by `name`, else `tool_use` when `tools`, else
    `default`."""
    if isinstance(templates, str):
        if name not in (None, "default"):
            raise ValueError(f"this model has a single chat template, not one named {name!r}")
        return templates
    if name is not None:
        if name not in templates:
            raise ValueError(f"no chat template named {name!r}; this model has {sorted(templates)}")
        return templates[name]
    if tools and "tool_use" in templates:
        return templates["tool_use"]
    if "default" not in templates:
        raise ValueError(
            f"this model has several chat templates, {sorted(templates)}, and none called "
            "'default', so none is chosen for it: copy the one to use into chat_template.jinja "
            "in the model's folder (in Python: chat_template_for(..., name=NAME))"
        )
    return templates["default"]


def chat_template_for(
    tokenizer: Tokenizer,
    *,
    folder: str | os.PathLike | None = None,
    template: str | None = None,
    name: str | None = None,
    tools: bool = False,
) -> ChatTemplate:
    """The chat template to render conversations for `tokenizer`'s model, with its special
    token strings.

    `template` (Jinja text) wins; then the files in `folder` (the checkpoint); then the template
    the tokenizer carries (a `FastTokenizer`'s `tokenizer_config`, a transformers tokenizer's
    `chat_template`); else zoo's `DEFAULT_TEMPLATE`, logged. `name` and `tools` choose among
    named templates (`pick_template`).
    """
    special = special_token_strings(tokenizer, folder=folder)
    origin = "the chat template passed in"
    found: Templates | None = template
    if found is None and folder is not None:
        found, origin = read_chat_templates(folder), f"the chat template of {folder}"
    if found is None:
        found, origin = _carried_template(tokenizer), f"the chat template of the {_kind(tokenizer)}"
    if found is None:
        logger.info(
            "the %s has no chat template: using zoo's default ('role:' line, content, eos token "
            "per turn; see zoo.data.chat.template)",
            _kind(tokenizer),
        )
        if "eos_token" not in special:
            raise ValueError(
                "zoo's default chat template ends every turn with the eos token, and this "
                "tokenizer has none; pass a template (--template FILE, template=...) that ends "
                "turns otherwise"
            )
        return ChatTemplate(DEFAULT_TEMPLATE, special, origin="zoo's default chat template")
    return ChatTemplate(pick_template(found, name=name, tools=tools), special, origin=origin)


def special_token_strings(
    tokenizer: Tokenizer, *, folder: str | os.PathLike | None = None
) -> dict[str, str]:
    """`{"bos_token": ..., "eos_token": ..., ...}`: the strings a template sees.

    As transformers does, from `tokenizer_config.json` (`folder`'s, else the one a
    `FastTokenizer` keeps), with `special_tokens_map.json` filling in; a role the config names
    as null stays absent. A tokenizer without such a config (char, word, tiktoken) gives the
    text of its own bos, eos, pad and unk ids.
    """
    config = getattr(tokenizer, "tokenizer_config", None)
    if folder is not None:
        config = _optional_json(Path(folder) / TOKENIZER_CONFIG)
        config = {**_optional_json(Path(folder) / SPECIAL_TOKENS_MAP), **config}
    transformers_map = getattr(getattr(tokenizer, "tokenizer", None), "special_tokens_map", None)
    if isinstance(config, Mapping) and any(f"{role}_token" in config for role in TOKEN_ROLES):
        found = {}
        for role in TOKEN_ROLES:
            value = config.get(f"{role}_token")
            value = value.get("content") if isinstance(value, Mapping) else value
            if isinstance(value, str):
                found[f"{role}_token"] = value
        return found
    if isinstance(transformers_map, Mapping):
        names = [f"{role}_token" for role in TOKEN_ROLES]
        return {name: str(transformers_map[name]) for name in names if transformers_map.get(name)}
    found = {}
    for role in ("bos", "eos", "pad", "unk"):
        token_id = token_id_or_none(tokenizer, role)
        if token_id is not None:
            found[f"{role}_token"] = tokenizer.decode([token_id], skip_special=False)
    return found


def token_id_or_none(tokenizer: Tokenizer, role: str) -> int | None:
    """`tokenizer.{role}_id`, None where it has none (a pad id that would fall back on a
    missing eos raises instead of answering None)."""
    try:
        return getattr(tokenizer, f"{role}_id")
    except ValueError:
        return None


def _carried_template(tokenizer: Tokenizer) -> Templates | None:
    """The template a tokenizer object carries: a FastTokenizer's config, transformers' attr."""
    config = getattr(tokenizer, "tokenizer_config", None)
    if isinstance(config, Mapping) and config.get("chat_template") is not None:
        return as_templates(config["chat_template"], "the tokenizer's tokenizer_config")
    carried = getattr(getattr(tokenizer, "tokenizer", None), "chat_template", None)
    return None if carried is None else as_templates(carried, "the transformers tokenizer")


def _kind(tokenizer: Tokenizer) -> str:
    return f"{tokenizer.kind or type(tokenizer).__name__} tokenizer"


def _optional_json(path: Path) -> JSONObject:
    """A tokenizer folder's optional JSON file, `{}` where it is absent."""
    return read_json_object(path, fix=DAMAGED_FIX, missing_ok=True)
