"""tiktoken's byte-level BPE encodings (gpt2, cl100k_base, ...) behind the zoo tokenizer interface.

The base vocabulary is the encoding's own. `<|endoftext|>` (when the encoding has it) serves as
both bos and eos, as in GPT-2; a dedicated pad id is added right after the base vocabulary (an
encoding without `<|endoftext|>` also gets bos and eos there). The reported `vocab_size` is
rounded up to a multiple of 64 so the embedding and output matrices tile well on accelerators;
the ids between the last special and `vocab_size` are never produced by `encode`.

Byte-level BPE has no unknown token: every string round-trips exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

from zoo.data.tokenizers.base import Tokenizer, state_entry
from zoo.files import JSONObject

VOCAB_MULTIPLE = 64
END_OF_TEXT = "<|endoftext|>"


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def load_encoding(name: str):
    """The tiktoken `Encoding` called `name`, with an error that says how to get it."""
    import tiktoken

    known = tiktoken.list_encoding_names()
    if name not in known:
        raise ValueError(f"unknown tiktoken encoding {name!r}; known encodings: {known}")
    try:
        return tiktoken.get_encoding(name)
    except Exception as error:  # offline without a cache: requests' ConnectionError, and more
        # an OSError (the world failed, not the input): the CLI prints it as one line
        raise OSError(
            f"could not load the tiktoken encoding {name!r} ({type(error).__name__}: {error}). "
            "tiktoken downloads it once and caches it; without a network, set "
            "TIKTOKEN_CACHE_DIR to a folder that holds tiktoken's cache files for it"
        ) from None


class TiktokenTokenizer(Tokenizer):
    """A tiktoken encoding by name: `TiktokenTokenizer("gpt2")` has vocab_size 50304, pad 50257.

    `pretrained=True` keeps the encoding's own vocabulary, as a pretrained checkpoint expects:
    no added pad (pad is `<|endoftext|>`, so mask padding by length, not by id) and no rounding
    (GPT-2: vocab_size 50257).
    """

    kind = "tiktoken"

    def __init__(self, encoding: str = "gpt2", *, pretrained: bool = False):
        self.encoding_name = encoding
        self.pretrained = pretrained
        self.encoding = load_encoding(encoding)
        base = self.encoding.n_vocab
        has_end = END_OF_TEXT in self.encoding.special_tokens_set
        if pretrained and not has_end:
            raise ValueError(f"encoding {encoding!r} has no {END_OF_TEXT} to serve as bos/eos/pad")
        if has_end:
            end = self.encoding.encode_single_token(END_OF_TEXT)
            self._bos_id, self._eos_id = end, end
            self._pad_id = end if pretrained else base
        else:
            self._bos_id, self._eos_id, self._pad_id = base, base + 1, base + 2
        self.base_vocab_size = base
        multiple = 1 if pretrained else VOCAB_MULTIPLE
        self._vocab_size = round_up(max(self._pad_id, self._eos_id, base - 1) + 1, multiple)
        # Names of the ids the encoding itself does not know.
        self._added = {self._pad_id: "<|pad|>", self._bos_id: "<|bos|>", self._eos_id: "<|eos|>"}
        self._added = {i: text for i, text in self._added.items() if i >= base}

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def pad_id(self) -> int:
        return self._pad_id

    @property
    def bos_id(self) -> int:
        return self._bos_id

    @property
    def eos_id(self) -> int:
        return self._eos_id

    def _encode(self, text: str) -> list[int]:
        # encode_ordinary: "<|endoftext|>" written in a text is text, not a control token.
        return self.encoding.encode_ordinary(text)

    def encode_many(
        self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = False
    ) -> list[list[int]]:
        prefix = [self._bos_id] if add_bos else []
        suffix = [self._eos_id] if add_eos else []
        encoded = self.encoding.encode_ordinary_batch(list(texts))
        return [[*prefix, *ids, *suffix] for ids in encoded]

    def _decode(self, ids: Sequence[int]) -> str:
        pieces: list[str] = []
        run: list[int] = []
        for i in ids:
            if i < 0 or i >= self._vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self._vocab_size})")
            if i < self.base_vocab_size:
                run.append(i)
                continue
            if run:
                pieces.append(self.encoding.decode(run))
                run = []
            pieces.append(self._added.get(i, f"<|unused:{i}|>"))
        if run:
            pieces.append(self.encoding.decode(run))
        return "".join(pieces)

    def state(self) -> JSONObject:
        return {"encoding": self.encoding_name, "pretrained": self.pretrained}

    def __reduce__(self):
        # Pickle (and `datasets` fingerprinting) by name: the merge table is 50k+ entries.
        return (_rebuild_tiktoken, (self.encoding_name, self.pretrained))

    @classmethod
    def from_state(cls, state: JSONObject) -> TiktokenTokenizer:
        pretrained = state_entry(state, "pretrained", bool, default=False)
        return cls(state_entry(state, "encoding", str), pretrained=pretrained)


def _rebuild_tiktoken(encoding: str, pretrained: bool) -> TiktokenTokenizer:
    return TiktokenTokenizer(encoding, pretrained=pretrained)
