"""Inference: KV-cached generation, beam search, batch translation and classification.

- `generate(gpt, prompts, max_new_tokens=..., sampling=SamplingSettings(...), key=...)`: greedy,
  or sampled with temperature, top-k and top-p; `beam_generate` for beam search
- `translate(translator, src, max_len=...)`: greedy or beam search from `bos_id`
- `classify(classifier, token_batch)`: class probabilities
- `zoo.decoding.chat`: replies to conversations through a chat template

Each compiles the whole decoding loop into one program (`lax.while_loop`, no Python loop per
token). Models stay per example; these functions do the batching.
"""

from zoo.decoding.beam import beam_search, length_penalty
from zoo.decoding.classify import classify
from zoo.decoding.generate import beam_generate, generate
from zoo.decoding.loop import Stopping, sample_loop
from zoo.decoding.sampling import SamplingSettings, filter_logits, top_k_filter, top_p_filter
from zoo.decoding.translate import beam_translate, translate

__all__ = [
    "SamplingSettings",
    "Stopping",
    "beam_generate",
    "beam_search",
    "beam_translate",
    "classify",
    "filter_logits",
    "generate",
    "length_penalty",
    "sample_loop",
    "top_k_filter",
    "top_p_filter",
    "translate",
]
