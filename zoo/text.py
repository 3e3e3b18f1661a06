"""Text from data or a model made safe to print: its control characters shown, not obeyed.

A data file, a chat template or a model's reply can hold characters a terminal obeys rather
than shows: ESC starts sequences that clear the screen, retitle the window or rewrite what was
printed; BEL rings; BS and CR move the cursor back over text; DEL and the C1 controls
(U+0080-U+009F) act in some terminals; and the bidirectional controls (U+202A-U+202E,
U+2066-U+2069, U+200E, U+200F, U+061C) reorder the text after them, so a line can read other
than it is. `printable` writes each of them as its Python escape (`\\x1b`, `\\r`, `\\u202e`),
so the text reads the same whatever the terminal; newlines and tabs stay where the layout keeps
them. `printable_json` does the same to JSON, losslessly (`\\u202e` is JSON's own escape).
"""

from __future__ import annotations

# The bidirectional formatting characters: embeddings and overrides (U+202A-U+202E), isolates
# (U+2066-U+2069), the left-to-right, right-to-left and Arabic letter marks.
BIDI_CONTROLS = (
    *(chr(code) for code in range(0x202A, 0x202F)),
    *(chr(code) for code in range(0x2066, 0x206A)),
    "\u200e",
    "\u200f",
    "\u061c",
)
# C0 (U+0000-U+001F), DEL and C1 (U+0080-U+009F), then the bidirectional controls
CONTROLS = (
    *(chr(code) for code in range(0x20)),
    "\x7f",
    *(chr(code) for code in range(0x80, 0xA0)),
    *BIDI_CONTROLS,
)


def _escape(character: str) -> str:
    """The character as Python's `repr` writes it: `\\r`, `\\x1b`, `\\u202e`."""
    if character in "\r\n\t":
        return {"\r": "\\r", "\n": "\\n", "\t": "\\t"}[character]
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_ONE_LINE = str.maketrans(
    {character: _escape(character) for character in CONTROLS if character != "\t"}
)
_LAYOUT = str.maketrans(
    {character: _escape(character) for character in CONTROLS if character not in "\n\t"}
)
# JSON's whitespace stays: between values it is layout, and inside strings `json.dumps` has
# already escaped it
_JSON = str.maketrans(
    {character: f"\\u{ord(character):04x}" for character in CONTROLS if character not in "\n\r\t"}
)


def printable(text: str, *, multiline: bool = True) -> str:
    """`text` with every control character (see the module doc) written as Python writes it:
    `\\x1b` for ESC, `\\r`, `\\u202e` for the right-to-left override. Tabs stay, and newlines
    too where `multiline` (else a newline is `\\n`, and the text is one line)."""
    return text.translate(_LAYOUT if multiline else _ONE_LINE)


def printable_json(line: str) -> str:
    """JSON text (`json.dumps(..., ensure_ascii=False)`) with the control characters its
    strings hold written as JSON escapes (`\\u009b`, `\\u202e`): the same JSON to a parser,
    harmless on a terminal. (Outside strings JSON holds none of them but its whitespace.)"""
    return line.translate(_JSON)


__all__ = ["BIDI_CONTROLS", "CONTROLS", "printable", "printable_json"]
