"""A GGUF file's tokenizer (`tokenizer.ggml.*` metadata) -> a zoo `FastTokenizer`.

GGUF keeps no `tokenizer.json`; it keeps the pieces, under llama.cpp's names:

- `tokenizer.ggml.model`: `gpt2` (byte-level BPE: GPT-2, Llama 3, Qwen, SmolLM) or `llama`
  (SentencePiece BPE with byte fallback: Llama 2, Mistral);
- `tokens`, `merges` (BPE; a `llama` file without them gets merges rebuilt from `scores`),
  `token_type` (3 = control tokens such as `<|im_end|>`, 4 = user-defined ones);
- `pre`: which split regex the byte-level vocabulary was learned with (`smollm`: digits one
  by one, as SmolLM's `tokenizer.json` splits them, where transformers' GGUF tokenizer does
  not, so the two differ on a space before a digit);
- the bos, eos, eot, eom, unknown and padding ids, `add_bos_token`, and
  `tokenizer.chat_template`.

From them a `tokenizers.Tokenizer` is built as transformers builds it from the same file, so
both give the same ids. It needs the `tokenizers` library (the `gguf` extra).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from zoo.interop.gguf.quants import INSTALL_GGUF
from zoo.interop.gguf.reader import GGUFFile, GGUFScalar
from zoo.interop.tokenizers.fast_tokenizer import FastTokenizer

if TYPE_CHECKING:
    import tokenizers

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types
PREFIX = "tokenizer.ggml."

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> the split regex its merges were learned with (others: GPT-2's)
SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _QWEN2_SPLIT),
}


def _require_tokenizers() -> None:
    """An ImportError that says what installs the tokenizers library, where it is missing
    (`gguf_tokenizer` calls it before the builders below import the library)."""
    try:
        import tokenizers  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"a GGUF file's tokenizer is built with the tokenizers library: {INSTALL_GGUF}"
        ) from error


def _list(gguf: GGUFFile, key: str) -> list[GGUFScalar]:
    """The array at `PREFIX + key` (empty where there is none); another value is refused."""
    value = gguf.get(PREFIX + key, [])
    if not isinstance(value, list):
        raise gguf.error(f"{PREFIX}{key} is not a list")
    return value


def _strings(gguf: GGUFFile, key: str) -> list[str]:
    values = _list(gguf, key)
    strings = [v for v in values if isinstance(v, str)]
    if len(strings) != len(values):
        raise gguf.error(f"{PREFIX}{key} is not a list of strings")
    return strings


def _numbers(gguf: GGUFFile, key: str) -> list[float]:
    values = _list(gguf, key)
    numbers = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(numbers) != len(values):
        raise gguf.error(f"{PREFIX}{key} is not a list of numbers")
    return numbers


def _byte_level(gguf: GGUFFile, tokens: list[str]) -> tokenizers.Tokenizer:
    import tokenizers as tok

    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {}
    for index, token in enumerate(tokens):
        if not set(token) <= alphabet:  # written as plain text: spell its bytes
            token = "".join(spelling[b] for b in token.encode("utf-8"))
        vocab[token] = index
    options = dict(continuing_subword_prefix="", end_of_word_suffix="")
    tokenizer = tok.Tokenizer(_bpe(gguf, vocab, _merges(gguf), **options))
    pre = gguf.get(PREFIX + "pre")
    byte_level = tok.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre not in SPLITS)
    if pre in SPLITS:
        split = tok.pre_tokenizers.Split(tok.Regex(SPLITS[pre]), behavior="isolated")
        tokenizer.pre_tokenizer = tok.pre_tokenizers.Sequence([split, byte_level])
    elif pre == "smollm":  # SmolLM's own tokenizer.json: digits one by one, then GPT-2's split
        digits = tok.pre_tokenizers.Digits(individual_digits=True)
        tokenizer.pre_tokenizer = tok.pre_tokenizers.Sequence([digits, byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = tok.decoders.ByteLevel()
    return tokenizer


def _merges(gguf: GGUFFile) -> list[tuple[str, str]]:
    """`tokenizer.ggml.merges` as pairs: each entry is two tokens joined by a space."""
    pairs = []
    for merge in _strings(gguf, "merges"):
        left, _, right = merge.partition(" ")
        if not left or not right:
            raise gguf.error(f"{PREFIX}merges holds {merge[:40]!r}, not two tokens and a space")
        pairs.append((left, right))
    return pairs


def _bpe(
    gguf: GGUFFile,
    vocab: dict[str, int],
    merges: list[tuple[str, str]],
    **options: str | bool,
) -> tokenizers.models.BPE:
    """The BPE model, with the library's complaint (a merge of unknown tokens) as one line."""
    from tokenizers.models import BPE

    try:
        return BPE(vocab, merges, **options)
    except Exception as error:  # the Rust side raises a bare Exception
        raise gguf.error(f"its tokenizer is inconsistent: {error}") from None


def byte_alphabet() -> dict[int, str]:
    """GPT-2's spelling of bytes as characters: printable bytes as themselves, the other 68
    as the characters from U+0100 on, in byte order."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(others)}}


def _rebuilt_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece keeps scores, not merges: every split of a token into two tokens is a
    merge, the higher the token's score the earlier (ties: shorter left piece first)."""
    ids = {token: index for index, token in enumerate(tokens)}
    found = []
    for token, score in zip(tokens, scores, strict=True):
        pairs = [(token[:i], token[i:]) for i in range(1, len(token))]
        pairs = sorted(
            (p for p in pairs if p[0] in ids and p[1] in ids), key=lambda p: (ids[p[0]], ids[p[1]])
        )
        found += [(score, left, right) for left, right in pairs]
    found.sort(key=lambda m: (m[0], len(m[1]), len(m[2])), reverse=True)
    return [(left, right) for _, left, right in found]


def _sentencepiece(gguf: GGUFFile, tokens: list[str]) -> tokenizers.Tokenizer:
    import tokenizers as tok

    vocab = {token: index for index, token in enumerate(tokens)}
    if PREFIX + "merges" in gguf.metadata:
        merges = _merges(gguf)
    else:
        scores = _numbers(gguf, "scores")
        if len(scores) != len(tokens):
            raise gguf.error(f"a llama tokenizer needs {PREFIX}scores, one per token")
        merges = _rebuilt_merges(tokens, scores)
    tokenizer = tok.Tokenizer(_bpe(gguf, vocab, merges, fuse_unk=True, byte_fallback=True))
    # llama.cpp's add_space_prefix: Gemma files prepend no space to the text
    prepend = "first" if gguf.get(PREFIX + "add_space_prefix", True) else "never"
    tokenizer.pre_tokenizer = tok.pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme=prepend, split=False
    )
    decoders = [tok.decoders.Replace("\u2581", " "), tok.decoders.ByteFallback()]
    decoders.append(tok.decoders.Fuse())
    if prepend == "first":  # the space it prepended goes again
        decoders.append(tok.decoders.Strip(" ", 1, 0))
    tokenizer.decoder = tok.decoders.Sequence(decoders)
    return tokenizer


BUILDERS: dict[str, Callable[[GGUFFile, list[str]], tokenizers.Tokenizer]] = {
    "gpt2": _byte_level,
    "llama": _sentencepiece,
}


def _add_special(
    gguf: GGUFFile, tokenizer: tokenizers.Tokenizer, tokens: list[str], byte_level: bool
) -> None:
    """Control tokens stay whole as special tokens, user-defined ones as plain added tokens."""
    import tokenizers as tok

    types = _list(gguf, "token_type")
    alphabet = set(byte_alphabet().values()) if byte_level else None
    control = [
        tok.AddedToken(token, normalized=False, special=True)
        for token, kind in zip(tokens, types, strict=False)
        # a byte-level "control" token outside the byte alphabet is a converter's mislabel
        if kind == CONTROL and (alphabet is None or set(token) <= alphabet)
    ]
    tokenizer.add_special_tokens(control)
    vocab = tokenizer.get_vocab()
    user = [
        tok.AddedToken(token, normalized=False, special=False)
        for token, kind in zip(tokens, types, strict=False)
        if kind == USER_DEFINED and token in vocab
    ]
    tokenizer.add_tokens(user)


def gguf_tokenizer(gguf: GGUFFile) -> FastTokenizer:
    """The tokenizer the file's metadata describes, with its special ids and chat template."""
    kind = gguf.get(PREFIX + "model")
    if not isinstance(kind, str) or kind not in BUILDERS:
        raise gguf.error(
            f"{PREFIX}model {kind!r} is not supported; zoo builds the tokenizers "
            f"{', '.join(BUILDERS)} (byte-level BPE and SentencePiece BPE)"
        )
    tokens = _strings(gguf, "tokens")
    if not tokens:
        raise gguf.error(f"{PREFIX}tokens is missing or empty")
    _require_tokenizers()
    tokenizer = BUILDERS[kind](gguf, tokens)
    _add_special(gguf, tokenizer, tokens, byte_level=kind == "gpt2")
    size = len(tokens)

    def token_id(name: str) -> int | None:
        value = gguf.get(f"{PREFIX}{name}_token_id")
        return value if isinstance(value, int) and 0 <= value < size else None

    ends = [token_id(name) for name in ("eos", "eot", "eom")]
    template = gguf.get("tokenizer.chat_template")
    adds_bos = gguf.get(PREFIX + "add_bos_token", kind == "llama")
    bos = token_id("bos")
    return FastTokenizer(
        tokenizer,
        bos_id=bos,
        eos_ids=list(dict.fromkeys(i for i in ends if i is not None)),
        pad_token_id=token_id("padding"),
        unk_id=token_id("unknown"),
        adds_bos=bool(adds_bos) and bos is not None,
        tokenizer_config={"chat_template": template} if isinstance(template, str) else {},
    )
