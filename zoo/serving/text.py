"""A request's tokens as text: decoded piece by piece and cut at the first stop string.

Text that could be the start of a stop string is held back until the next tokens show whether
it is one, so a streamed reply never shows a stop string, or the part of one that began it.
"""

from __future__ import annotations

from collections.abc import Sequence

from zoo.data.tokenizers.base import Tokenizer
from zoo.decoding.chat import TextStream


class StopText:
    """The text of a growing list of ids, ending before the first of `stops` it contains."""

    def __init__(self, tokenizer: Tokenizer, stops: Sequence[str] = ()):
        self.stream = TextStream(tokenizer)
        self.stops = tuple(stop for stop in stops if stop)
        self.held = ""  # text shown by the stream that may begin a stop string
        self.stopped = False  # a stop string was found: nothing more is shown

    def add(self, token: int) -> str:
        """The text `token` releases ("" while it may be part of a stop string)."""
        if self.stopped:
            return ""
        return self._release(self.stream.add(token), final=False)

    def finish(self) -> str:
        """Whatever is left once the tokens end."""
        if self.stopped:
            return ""
        return self._release(self.stream.finish(), final=True)

    def _release(self, piece: str, *, final: bool) -> str:
        text = self.held + piece
        found = [index for index in (text.find(stop) for stop in self.stops) if index >= 0]
        if found:
            self.stopped, self.held = True, ""
            return text[: min(found)]
        if final:
            self.held = ""
            return text
        keep = _longest_stop_prefix(text, self.stops)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]


def _longest_stop_prefix(text: str, stops: Sequence[str]) -> int:
    """The length of the longest end of `text` that begins some stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[len(text) - size :]):
                longest = size
                break
    return longest
