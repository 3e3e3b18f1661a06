"""Tokenizers and data: text -> token ids -> fixed-shape batches."""

from zoo.data.batches import ArrayBatches, Batch, BatchSource
from zoo.data.tokenizer import CharTokenizer, Tokenizer, load_tokenizer

__all__ = ["ArrayBatches", "Batch", "BatchSource", "CharTokenizer", "Tokenizer", "load_tokenizer"]
