"""Tokenizers and data: text -> token ids -> fixed-shape batches.

Tokenizers (`CharTokenizer`, `WordTokenizer`, `TiktokenTokenizer`, `PairTokenizer`,
`build_tokenizer`), batch sources (`ArrayBatches`, `BucketedBatches`, packing, streaming),
HuggingFace datasets in (`load_spec`, `from_hf`) and evaluation metrics. The parts that need
`datasets` are imported on first use, so `import zoo.data` stays quick.
"""

from __future__ import annotations

import importlib
from typing import Any

from zoo.data.batches import ArrayBatches, Batch, BatchSource
from zoo.data.bucketing import BucketedBatches
from zoo.data.build import TOKENIZER_KINDS, build_tokenizer
from zoo.data.errors import DataError
from zoo.data.metrics import accuracy, bleu, confusion_matrix
from zoo.data.options import TASKS, DataConfig, bucket_lengths
from zoo.data.packing import RandomBlocks, pack_blocks, packed_batches, unpack_blocks
from zoo.data.pair import PairTokenizer, source_tokenizer, target_tokenizer
from zoo.data.ragged import Ragged
from zoo.data.tiktoken_tokenizer import TiktokenTokenizer
from zoo.data.tokenizer import CharTokenizer, Tokenizer, load_tokenizer
from zoo.data.word import WordTokenizer

# Names whose modules import `datasets` (about a second): loaded when first asked for.
_LAZY = {
    "load_spec": "zoo.data.specs",
    "SCHEMES": "zoo.data.specs",
    "from_hf": "zoo.data.hf",
    "TaskData": "zoo.data.hf",
    "StreamingBatches": "zoo.data.streaming",
}


def __getattr__(name: str) -> Any:
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
    "CharTokenizer",
    "DataConfig",
    "DataError",
    "PairTokenizer",
    "Ragged",
    "RandomBlocks",
    "TiktokenTokenizer",
    "Tokenizer",
    "WordTokenizer",
    "accuracy",
    "bleu",
    "bucket_lengths",
    "build_tokenizer",
    "confusion_matrix",
    "load_tokenizer",
    "pack_blocks",
    "packed_batches",
    "source_tokenizer",
    "target_tokenizer",
    "unpack_blocks",
    *_LAZY,
]
