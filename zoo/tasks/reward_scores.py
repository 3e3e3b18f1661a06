"""A trained reward model as a reward function of RL from rewards (`zoo.tasks.rewards`).

Each prompt and completion is encoded as the reward model read its pairs in training
(`zoo.data.preference_data`): text as `prompt + completion` with bos where the tokenizer puts it
and eos after it, messages rendered whole with the reward model's chat template. The rows are
scored in batches by one compiled call (lengths padded to a power of two, so that few shapes
compile).
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from zoo.data.chat.template import ChatTemplate
from zoo.data.tokenizers.base import Tokenizer
from zoo.models.classifier import Classifier
from zoo.models.gpt import GPT
from zoo.tasks.reward import RewardModel, RewardModeling
from zoo.tasks.rewards import RewardFunction


def _encode(
    prompt: object, completion: object, tokenizer: Tokenizer, template: ChatTemplate | None
) -> tuple[list[int], ChatTemplate | None]:
    """The ids of one prompt + completion, and the template (found on first need)."""
    from zoo.data.chat.files import chat_template_for
    from zoo.data.chat.tokens import encode_chat

    if isinstance(prompt, str) and isinstance(completion, str):
        bos = tokenizer.bos_id is not None and tokenizer.puts_bos_first
        ids = tokenizer.encode(
            prompt + completion, add_bos=bos, add_eos=tokenizer.eos_id is not None
        )
        return list(ids), template
    if isinstance(prompt, list) and isinstance(completion, list):
        template = template or chat_template_for(tokenizer)
        rendered = encode_chat([*prompt, *completion], tokenizer, template=template)
        return rendered.input_ids.tolist(), template
    raise TypeError(
        "a reward model scores a text prompt with a text completion, or messages with messages; "
        f"got {type(prompt).__name__} and {type(completion).__name__}"
    )


def model_reward(
    model: RewardModel,
    tokenizer: Tokenizer,
    *,
    template: ChatTemplate | None = None,
    name: str = "reward_model",
    batch_size: int = 32,
) -> RewardFunction:
    """A reward function (TRL's signature) that scores each completion with `model`, a reward
    model (a one-class `zoo.Classifier` or a `zoo.GPT` with a score head) whose tokenizer is
    `tokenizer`.

    Args:
        model: the reward model.
        tokenizer: the tokenizer it was trained with.
        template: the chat template of conversational prompts (default: the tokenizer's own).
        name: the function's name, which its metrics carry (`rewards/NAME/mean`).
        batch_size: rows per compiled call.
    """
    RewardModeling().check_model(model)
    longest = (
        model.config.max_tokens if isinstance(model, Classifier) else model.config.max_positions
    )
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0

    @eqx.filter_jit
    def scores(model, tokens, lengths):
        mask = jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]
        if isinstance(model, GPT):
            return jax.vmap(lambda t, m: model.scores_and_router(t, m).output[0])(tokens, mask)
        return jax.vmap(lambda t, m: model.logits_and_router(t, m).output[0])(tokens, mask)

    found: list[ChatTemplate | None] = [template]

    def reward(prompts: Sequence[object], completions: Sequence[object], **_: object) -> list:
        rows = []
        for prompt, completion in zip(prompts, completions, strict=True):
            ids, found[0] = _encode(prompt, completion, tokenizer, found[0])
            rows.append(ids[:longest])  # the start kept, as preference data keeps it
        out: list[float] = []
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            width = min(longest, 1 << max(3, (max(map(len, chunk)) - 1).bit_length()))
            tokens = np.full((batch_size, width), pad, np.int32)
            lengths = np.ones(batch_size, np.int32)  # rows past the chunk: one pad token
            for row, ids in enumerate(chunk):
                tokens[row, : len(ids)] = ids
                lengths[row] = len(ids)
            values = np.asarray(scores(model, tokens, lengths), np.float64)
            out.extend(values[: len(chunk)].tolist())
        return out

    reward.__name__ = name
    return reward
