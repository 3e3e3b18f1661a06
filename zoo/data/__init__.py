"""Tokenizers and data: text -> token ids -> fixed-shape batches.

Tokenizers (`zoo.data.tokenizers`: `CharTokenizer`, `WordTokenizer`, `TiktokenTokenizer`,
`PairTokenizer`, `build_tokenizer`), batch sources (`ArrayBatches`, `BucketedBatches`,
`DrawnBatches`, packing, streaming), HuggingFace datasets in (`load_spec`, `from_hf`, options
in `DataConfig`),
conversations for instruction tuning (`zoo.data.chat`: chat templates, `encode_chat`,
`chat_data`, options in `ChatDataConfig`) and evaluation metrics. The parts that need `datasets`
are imported on first use, so `import zoo.data` stays quick. Every name is also importable from
here, as before the subpackages.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from zoo.data.batches import ArrayBatches, Batch, BatchSource
from zoo.data.bucketing import BucketedBatches, DrawnBatches
from zoo.data.chat.batches import ChatExamples, chat_batches, encode_conversations
from zoo.data.chat.conversations import conversation_messages, conversations, detect_format
from zoo.data.chat.files import chat_template_for
from zoo.data.chat.options import ChatDataConfig
from zoo.data.chat.preference import (
    PreferenceData,
    PreferenceDataConfig,
    PreferencePair,
    encode_rows,
    preference_data,
    special_tokens_for,
)
from zoo.data.chat.template import DEFAULT_TEMPLATE, ChatTemplate
from zoo.data.chat.tokens import ChatTokens, encode_chat, encode_prompt, end_of_turn_ids
from zoo.data.errors import DataError
from zoo.data.metrics import accuracy, bleu, confusion_matrix
from zoo.data.options import TASKS, DataConfig, bucket_lengths
from zoo.data.packing import RandomBlocks, pack_blocks, packed_batches, unpack_blocks
from zoo.data.ragged import Ragged
from zoo.data.tokenizers.base import Tokenizer, load_tokenizer
from zoo.data.tokenizers.build import TOKENIZER_KINDS, build_tokenizer
from zoo.data.tokenizers.char import CharTokenizer
from zoo.data.tokenizers.pair import PairTokenizer, source_tokenizer, target_tokenizer
from zoo.data.tokenizers.tiktoken_tokenizer import TiktokenTokenizer
from zoo.data.tokenizers.word import WordTokenizer

if TYPE_CHECKING:  # for type checkers, the names loaded on first use below
    from zoo.data.chat.datasets import ChatData as ChatData
    from zoo.data.chat.datasets import chat_data as chat_data
    from zoo.data.hf import TaskData as TaskData
    from zoo.data.hf import from_hf as from_hf
    from zoo.data.specs import SCHEMES as SCHEMES
    from zoo.data.specs import load_spec as load_spec
    from zoo.data.streaming import StreamingBatches as StreamingBatches

# Names whose modules import `datasets` (about a second): loaded when first asked for.
_LAZY = {
    "load_spec": "zoo.data.specs",
    "SCHEMES": "zoo.data.specs",
    "from_hf": "zoo.data.hf",
    "TaskData": "zoo.data.hf",
    "StreamingBatches": "zoo.data.streaming",
    "chat_data": "zoo.data.chat.datasets",
    "ChatData": "zoo.data.chat.datasets",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zoo.data' has no attribute {name!r}")


__all__ = [
    "TASKS",
    "TOKENIZER_KINDS",
    "ArrayBatches",
    "Batch",
    "BatchSource",
    "BucketedBatches",
    "DrawnBatches",
    "CharTokenizer",
    "ChatDataConfig",
    "ChatExamples",
    "ChatTemplate",
    "ChatTokens",
    "DEFAULT_TEMPLATE",
    "DataConfig",
    "DataError",
    "PairTokenizer",
    "PreferenceData",
    "PreferenceDataConfig",
    "PreferencePair",
    "Ragged",
    "RandomBlocks",
    "TiktokenTokenizer",
    "Tokenizer",
    "WordTokenizer",
    "accuracy",
    "bleu",
    "bucket_lengths",
    "build_tokenizer",
    "chat_batches",
    "chat_template_for",
    "confusion_matrix",
    "conversation_messages",
    "conversations",
    "detect_format",
    "encode_chat",
    "encode_conversations",
    "encode_prompt",
    "encode_rows",
    "end_of_turn_ids",
    "load_tokenizer",
    "pack_blocks",
    "packed_batches",
    "preference_data",
    "special_tokens_for",
    "source_tokenizer",
    "target_tokenizer",
    "unpack_blocks",
    *_LAZY,
]
