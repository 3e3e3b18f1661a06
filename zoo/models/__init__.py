"""The three flavors: encoder classifier, decoder-only GPT, encoder-decoder translator."""

from zoo.models.classifier import Classifier, ClassifierConfig
from zoo.models.common import Routed
from zoo.models.config import TransformerConfig
from zoo.models.gpt import GPT, GPTConfig, with_score_head
from zoo.models.translator import Translator, TranslatorConfig, TranslatorState

# flavor name -> (config class, model class)
FLAVORS = {
    "classifier": (ClassifierConfig, Classifier),
    "gpt": (GPTConfig, GPT),
    "translator": (TranslatorConfig, Translator),
}


def flavor_of(obj) -> str:
    """The flavor name of a model or a config."""
    for name, (config_cls, model_cls) in FLAVORS.items():
        if isinstance(obj, config_cls | model_cls):
            return name
    raise TypeError(f"not a zoo model or config: {type(obj).__name__}")


__all__ = [
    "FLAVORS",
    "GPT",
    "Classifier",
    "ClassifierConfig",
    "GPTConfig",
    "Routed",
    "TransformerConfig",
    "Translator",
    "TranslatorConfig",
    "TranslatorState",
    "flavor_of",
    "with_score_head",
]
