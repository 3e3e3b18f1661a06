"""The model a command works on: every command's MODEL argument and `zoo train --init`.

One spelling everywhere: a path names a directory written by `zoo train` / `zoo.save`, a
HuggingFace checkpoint folder (its `config.json` and weights) or a llama.cpp `.gguf` file;
`hf:NAME` names a model on the HuggingFace hub (`hf:gpt2`, `hf:Helsinki-NLP/opus-mt-de-en`),
downloaded once and cached, as `--data hf:NAME` names a hub dataset. A bare hub name given to
`--init` (`--init gpt2`, which `zoo train` once took) still loads, with a note that says to
write `hf:gpt2`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TypeVar, overload

import equinox as eqx

from zoo.data.tokenizers.base import TOKENIZER_FILE, Tokenizer
from zoo.models import FLAVORS, flavor_of
from zoo.models.classifier import Classifier
from zoo.models.gpt import GPT
from zoo.models.translator import Translator
from zoo.serialize import CONFIG_FILE, is_zoo_folder, load_with_tokenizer

HUB = "hf:"
MODEL_HELP = (
    "a directory written by zoo train or zoo.save, a HuggingFace checkpoint folder, a .gguf "
    "file, or hf:NAME"
)
GPT2_VOCAB_SIZE = 50257  # GPT-2's BPE vocabulary: tiktoken's gpt2 encoding, no files needed

Model = GPT | Classifier | Translator
Flavor = TypeVar("Flavor", bound=Model)


@overload
def load_model(
    spec: str, kind: type[Flavor], adapter: str | None = None, *, option: str = "MODEL"
) -> tuple[Flavor, Tokenizer]: ...


@overload
def load_model(
    spec: str, kind: None = None, adapter: str | None = None, *, option: str = "MODEL"
) -> tuple[Model, Tokenizer]: ...


def load_model(
    spec: str,
    kind: type[eqx.Module] | None = None,
    adapter: str | None = None,
    *,
    option: str = "MODEL",
) -> tuple[Model, Tokenizer]:
    """`(model, tokenizer)` of a command's MODEL argument: a zoo directory, a HuggingFace
    checkpoint folder or `hf:NAME`.

    `adapter` is a PEFT LoRA adapter folder put on the model. Raises if the model is not a
    `kind` (`GPT`, `Classifier`, `Translator`; any of them without one) or comes without a
    tokenizer (the command encodes text with it).
    """
    model, tokenizer = read_model(spec, option=option)
    if adapter is not None:
        from zoo.lora.peft_load import load_adapter

        model = load_adapter(model, adapter)
    if kind is not None and not isinstance(model, kind):
        wanted = next(name for name, (_, model_class) in FLAVORS.items() if model_class is kind)
        raise ValueError(f"{spec} holds a {flavor_of(model)} model; this command needs a {wanted}")
    if tokenizer is None:
        raise FileNotFoundError(
            f"{spec} has no tokenizer (zoo_tokenizer.json, tokenizer.json, vocab.txt, ...), so "
            "text cannot be encoded; save the model with zoo.save(model, dir, tokenizer=...) or "
            "copy the checkpoint's tokenizer files into the folder"
        )
    return model, tokenizer


def read_model(spec: str, *, option: str) -> tuple[Model, Tokenizer | None]:
    """`(model, tokenizer or None)` of `spec`, the value of the command-line option `option`
    (`MODEL`, `--init`): a zoo directory, a HuggingFace checkpoint folder or `hf:NAME`."""
    model, tokenizer = _read(spec, option)
    return _zoo_model(model, spec, option), tokenizer


def _zoo_model(model: eqx.Module, spec: str, option: str) -> Model:
    if not isinstance(model, GPT | Classifier | Translator):
        raise TypeError(f"{option} {spec} holds a {type(model).__name__}, not a zoo model")
    return model


def _read(spec: str, option: str) -> tuple[eqx.Module, Tokenizer | None]:
    from zoo.interop.loading import from_pretrained

    if spec.startswith(HUB):
        return from_pretrained(spec[len(HUB) :], return_tokenizer=True)
    folder = Path(spec).expanduser()
    if folder.is_file() and folder.suffix.lower() == ".gguf":  # llama.cpp's one-file models
        return from_pretrained(folder, return_tokenizer=True)
    if folder.is_dir() and is_zoo_folder(folder):
        return load_with_tokenizer(folder)
    if folder.is_dir() and (folder / CONFIG_FILE).is_file():
        model = _zoo_model(from_pretrained(folder), spec, option)
        return model, folder_tokenizer(folder, model)
    if folder.is_dir() and option != "--init":
        stopped = _stopped_run(folder, spec)
        if stopped is not None:
            return stopped
    if option == "--init" and _hub_name(spec):
        print(
            f"zoo train: --init {spec} is read as the hub model {HUB}{spec}; write --init "
            f"{HUB}{spec} (a bare hub name will stop working)",
            file=sys.stderr,
        )
        return from_pretrained(spec, return_tokenizer=True)
    what = f"a folder without {CONFIG_FILE}" if folder.is_dir() else "no such folder"
    hint = f"; a model on the hub is written {HUB}{spec}" if _hub_name(spec) else ""
    raise FileNotFoundError(
        f"{option} {spec} is not a model directory ({what}{hint}); pass a directory written by "
        f"`zoo train` or `zoo.save` (it holds {CONFIG_FILE}), a HuggingFace checkpoint folder, "
        f"a llama.cpp .gguf file, or {HUB}NAME for a model on the hub ({HUB}gpt2)"
    )


def _stopped_run(folder: Path, spec: str) -> tuple[eqx.Module, Tokenizer | None] | None:
    """The newest checkpoint's model of a run stopped before it saved its model (SIGTERM,
    Ctrl-C), with the tokenizer the run recorded; None when `folder` holds no checkpoint."""
    from zoo.data.tokenizers.base import load_tokenizer
    from zoo.train.checkpoint_model import newest_checkpoint_model

    found = newest_checkpoint_model(folder)
    if found is None:
        return None
    model, checkpoint = found
    print(
        f"zoo: {spec} holds no saved model (its run stopped early): using its newest "
        f"checkpoint, {checkpoint.parent.name}/{checkpoint.name}",
        file=sys.stderr,
    )
    has_tokenizer = (folder / TOKENIZER_FILE).is_file()
    return model, load_tokenizer(folder) if has_tokenizer else None


def _hub_name(spec: str) -> bool:
    """Whether `spec` (no such path here) has the shape of a hub name: `gpt2`, `org/name`."""
    path = Path(spec)
    local = spec.startswith((".", "/", "~")) or spec.count("/") > 1 or bool(path.suffix)
    return not local and not path.exists()


def folder_tokenizer(folder: Path, model: Model) -> Tokenizer | None:
    """The tokenizer of a HuggingFace checkpoint folder, None when it has no tokenizer files.

    GPT-2's own vocabulary needs no files (it is tiktoken's gpt2 encoding); any other model
    without them gets None rather than a tokenizer guessed by `transformers`.
    """
    from zoo.interop.files import TOKENIZER_PATTERNS
    from zoo.interop.tokenizers.hf_tokenizer import pretrained_tokenizer

    patterns = [*TOKENIZER_PATTERNS, TOKENIZER_FILE]
    has_files = any(next(folder.glob(pattern), None) is not None for pattern in patterns)
    vocab_size = model.config.vocab_size
    gpt2_vocabulary = flavor_of(model) == "gpt" and vocab_size == GPT2_VOCAB_SIZE
    return pretrained_tokenizer(folder) if has_files or gpt2_vocabulary else None
