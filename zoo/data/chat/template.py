"""A model's chat template: the Jinja text that turns a conversation into the text the model reads.

Rendered the way transformers' `apply_chat_template` renders it: a sandboxed Jinja environment
(`ImmutableSandboxedEnvironment`, `trim_blocks=True`, `lstrip_blocks=True`, loop controls), a
`tojson` filter that keeps non-ASCII text, `raise_exception(message)` and `strftime_now(format)`
globals, and the variables `messages`, `add_generation_prompt`, `tools` (None unless given: a
list of function schemas), `documents` (None) and the tokenizer's special token strings
(`bos_token`, `eos_token`, ...), which the caller's own variables override.

`{% generation %}...{% endgeneration %}` (transformers' extension) marks text the assistant
generates; `ChatTemplate.spans` gives its character spans in the rendered text.

`DEFAULT_TEMPLATE` serves models without a template of their own (gpt2, a zoo model trained
from scratch with a char or word tokenizer): each turn is `role:` on a line, then the content,
then the eos token, then a newline; the generation prompt is `assistant:` and a newline.

- The eos token ends each turn because every zoo tokenizer has one and generation already stops
  on it, whereas ChatML markers (`<|im_start|>`) are no token in such vocabularies: a word
  tokenizer reads them as `<unk>`, a char or byte-level one spells them out, and nothing stops
  generation at them.
- The content starts on a new line, not after `role: `: byte-level BPE (GPT-2) joins a space to
  the word after it, so a prompt ending in a space would ask the model to continue in the middle
  of a token it never saw split there in training.

Templates come from strangers, so rendering is bounded (`RenderLimits`): a time limit, a limit
on the rendered text, a limit on the items `range` may produce over one rendering, and on the
size of a string or list built by `*`. `{% include %}`, `{% import %}` and `{% extends %}` are
refused (a template is rendered on its own, with no files beside it). Every failure inside a
template, a limit reached or an error of its own, is one `ValueError` naming the template; the
words of a template's own refusal (`raise_exception`), which may quote the conversation, come
with their control characters escaped (`zoo.text.printable`).

jinja2 is an optional dependency: `pip install 'jax-transformer-zoo[chat]'`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from types import ModuleType
from typing import TYPE_CHECKING

from zoo.extras import pip_install
from zoo.text import printable

if TYPE_CHECKING:  # jinja2 is optional: imported where a template is rendered
    from jinja2 import Template
    from jinja2.parser import Parser
    from jinja2.runtime import Context
    from jinja2.sandbox import ImmutableSandboxedEnvironment

INSTALL_CHAT = pip_install("chat")
MIN_JINJA = (3, 1, 6)  # older releases have known sandbox escapes; hub templates are untrusted
# A template longer than this is refused before it is parsed: the longest real ones, with tool
# calling and reasoning, are some tens of thousands of characters
MAX_TEMPLATE_CHARS = 1_000_000
# Private-use characters that bracket `{% generation %}` output while spans are being found.
GENERATION_START, GENERATION_END = "\ue000", "\ue001"
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")

DEFAULT_TEMPLATE = """\
{#- zoo's default chat template (zoo/data/chat/template.py says why it looks like this) #}
{%- if bos_token is defined and bos_token %}{{ bos_token }}{% endif %}
{%- for message in messages %}
    {{- message['role'] + ':\\n' }}
    {%- if message['role'] == 'assistant' %}
        {%- generation %}{{ message['content'] + eos_token }}{% endgeneration %}
    {%- else %}
        {{- message['content'] + eos_token }}
    {%- endif %}
    {{- '\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{ 'assistant:\\n' }}{% endif %}
"""

_marking: ContextVar[bool] = ContextVar("zoo_chat_generation_marks", default=False)


@dataclass(frozen=True)
class RenderLimits:
    """What one rendering of a chat template may spend; past any of them it is refused.

    A real template renders a conversation in milliseconds, with a few `range` items; these
    bounds stop a hostile one (nested loops, a string of 10 GB, a macro that never returns)
    long before it costs time or memory.
    """

    seconds: float = 10.0  # wall time of one rendering
    characters: int = 16_000_000  # length of the rendered text (a 128k-token chat is ~0.6M)
    range_items: int = 1_000_000  # items every `range(...)` of one rendering produces, together
    repeat: int = 16_000_000  # length of a string or list built with `*`


LIMITS = RenderLimits()


class TemplateLimitReached(Exception):
    """A rendering went past one of its `RenderLimits`."""


@dataclass
class _Budget:
    """What is left of the limits during one rendering."""

    limits: RenderLimits
    deadline: float
    range_items: int

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitReached(f"it ran past the {self.limits.seconds:g} s time limit")


_budget: ContextVar[_Budget | None] = ContextVar("zoo_chat_render_budget", default=None)


def _current_budget() -> _Budget:
    budget = _budget.get()
    if budget is None:  # a template compiled here but rendered by other code: default limits
        budget = _Budget(LIMITS, time.monotonic() + LIMITS.seconds, LIMITS.range_items)
        _budget.set(budget)
    return budget


def _bounded_range(*args: int) -> range:
    """`range`, its items counted against the rendering's budget (nested loops add up)."""
    budget = _current_budget()
    budget.check_time()
    numbers = range(*args)
    if len(numbers) > budget.range_items:
        raise TemplateLimitReached(
            f"its range() calls produce more than {budget.limits.range_items:,} items"
        )
    budget.range_items -= len(numbers)
    return numbers


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template's Jinja `source` and the special token strings it is rendered with.

    `origin` says where the template came from (a file, a tokenizer, zoo's default), for errors.
    """

    source: str
    special_tokens: Mapping[str, str] = field(default_factory=dict)
    origin: str = "a chat template"

    @property
    def has_generation_blocks(self) -> bool:
        """Whether the template marks the assistant's text with `{% generation %}` blocks."""
        return GENERATION_TAG.search(self.source) is not None

    @property
    def variables(self) -> frozenset[str]:
        """The variables the template reads that a caller may set: those it does not set
        itself, beyond what every rendering fills in (`messages`, `add_generation_prompt`,
        `tools`, `documents`, the globals); e.g. Llama 3's `date_string`, `bos_token`."""
        return _read_variables(self.source, self.origin)

    def render(
        self,
        messages: Sequence[Mapping[str, object]],
        *,
        add_generation_prompt: bool = False,
        **variables: object,
    ) -> str:
        """The conversation as text; `add_generation_prompt` ends it with the opening of an
        assistant turn (for generation); `variables` reach the template (`tools`, a list of
        function schemas; `date_string`, ...)."""
        return self._render(messages, add_generation_prompt, variables, marking=False)

    def spans(
        self,
        messages: Sequence[Mapping[str, object]],
        *,
        add_generation_prompt: bool = False,
        **variables: object,
    ) -> tuple[str, list[tuple[int, int]]]:
        """`render`'s text and the `(start, end)` character span of every `{% generation %}`
        block in it, in order (none for a template without them)."""
        for value in _strings(messages, variables):
            if GENERATION_START in value or GENERATION_END in value:
                raise ValueError(
                    "the conversation holds the private-use character U+E000 or U+E001, which "
                    "mark {% generation %} blocks while they are measured; remove them"
                )
        marked = self._render(messages, add_generation_prompt, variables, marking=True)
        return _unmark(marked, self.origin)

    def _render(
        self,
        messages: Sequence[Mapping[str, object]],
        add_generation_prompt: bool,
        variables: Mapping[str, object],
        *,
        marking: bool,
    ) -> str:
        jinja2 = _jinja()
        compiled = _compile(self.source, self.origin)
        context = {
            **self.special_tokens,
            **variables,
            "messages": [dict(message) for message in messages],
            "tools": template_tools(variables.get("tools")),
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }
        limits = LIMITS
        token = _marking.set(marking)
        budget = _budget.set(_Budget(limits, time.monotonic() + limits.seconds, limits.range_items))
        try:
            return _bounded_text(compiled.generate(**context), limits)
        except TemplateLimitReached as error:
            raise ValueError(f"{self.origin} refused: {error}") from None
        except jinja2.TemplateError as error:  # raise_exception's words may quote the data
            raise ValueError(
                f"{self.origin} cannot render this conversation: {printable(str(error))} (roles: "
                f"{[message.get('role') for message in messages]})"
            ) from None
        except RecursionError:
            raise ValueError(
                f"{self.origin} refused: it nests calls too deeply (a macro or a recursive "
                "loop that calls itself without end)"
            ) from None
        except MemoryError:
            raise ValueError(f"{self.origin} refused: it ran out of memory") from None
        except Exception as error:  # the template's own code failed (a TypeError, ...)
            raise ValueError(
                f"{self.origin} failed while rendering: {type(error).__name__}: "
                f"{printable(str(error))}"
            ) from None
        finally:
            _budget.reset(budget)
            _marking.reset(token)


def template_tools(tools: object) -> list[dict[str, object]] | None:
    """The `tools` a template is given: a list of function schemas (mappings) copied, or None."""
    if tools is None:
        return None
    if isinstance(tools, str | bytes) or not isinstance(tools, Sequence):
        raise TypeError(f"tools should be a list of function schemas, got {type(tools).__name__}")
    schemas = []
    for tool in tools:
        if not isinstance(tool, Mapping):
            raise TypeError(f"a tool should be a function schema (a mapping), got {tool!r:.60}")
        schemas.append(dict(tool))
    return schemas


def _bounded_text(chunks: Iterator[str], limits: RenderLimits) -> str:
    """The rendered chunks joined, refused as soon as they pass the size or time limit."""
    budget = _current_budget()
    pieces, size = [], 0
    for chunk in chunks:
        size += len(chunk)
        if size > limits.characters:
            raise TemplateLimitReached(f"it renders more than {limits.characters:,} characters")
        budget.check_time()
        pieces.append(chunk)
    return "".join(pieces)


def _jinja() -> ModuleType:
    """The jinja2 module, or an ImportError that says how to install it."""
    try:
        import jinja2
    except ImportError as error:
        raise ImportError(f"chat templates are rendered with jinja2: {INSTALL_CHAT}") from error
    version = tuple(int(part) for part in jinja2.__version__.split(".")[:3] if part.isdigit())
    if version < MIN_JINJA:
        raise ImportError(
            f"chat templates need jinja2 >= 3.1.6 (older versions have sandbox escapes), found "
            f"{jinja2.__version__}: {INSTALL_CHAT}"
        )
    return jinja2


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    """The one sandboxed environment every template compiles in (see the module doc)."""
    jinja2 = _jinja()
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """`{% generation %}...{% endgeneration %}`: its text, bracketed while measuring."""

        tags = {"generation"}  # noqa: RUF012 (jinja2 reads a set here)

        def parse(self, parser: Parser) -> nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_bracket", [])
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _bracket(self, caller: Callable[[], str]) -> str:
            text = caller()
            return f"{GENERATION_START}{text}{GENERATION_END}" if _marking.get() else text

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: object,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        # Jinja's own tojson escapes HTML characters; templates expect plain JSON.
        return json.dumps(
            value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
            sort_keys=sort_keys,
        )  # fmt: skip

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        """The sandbox, with every call and every `*` / `**` counted against the limits."""

        intercepted_binops = frozenset(["*", "**"])

        def call_binop(
            self, context: Context, operator: str, left: object, right: object
        ) -> object:
            limit = _current_budget().limits.repeat
            if operator == "*":
                for sequence, count in ((left, right), (right, left)):
                    if (
                        isinstance(sequence, str | list | tuple)
                        and isinstance(count, int)
                        and len(sequence) * count > limit
                    ):
                        raise TemplateLimitReached(
                            f"it builds a {type(sequence).__name__} of "
                            f"{len(sequence) * count:,} items with '*' (at most {limit:,})"
                        )
            if operator == "**" and isinstance(right, int) and abs(right) > 1024:
                raise TemplateLimitReached(f"it raises a number to the power {right}")
            return super().call_binop(context, operator, left, right)

        def call(
            __self, __context: Context, __obj: object, *args: object, **kwargs: object
        ) -> object:
            budget = _current_budget()
            budget.check_time()
            # str.ljust(10**10), list.__mul__: a method of a string or list given a huge size
            owner = getattr(__obj, "__self__", None)
            sizes = [value for value in (*args, *kwargs.values()) if isinstance(value, int)]
            sized = isinstance(owner, str | bytes | list | tuple)
            if sized and any(abs(size) > budget.limits.repeat for size in sizes):
                raise TemplateLimitReached(
                    f"it calls {getattr(__obj, '__name__', 'a function')} with a size over "
                    f"{budget.limits.repeat:,}"
                )
            return super().call(__context, __obj, *args, **kwargs)

    environment = BoundedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationBlock, "jinja2.ext.loopcontrols"],
    )
    environment.filters["tojson"] = tojson
    for name in ("center", "indent", "wordwrap", "truncate", "batch", "slice"):
        environment.filters[name] = _sized_filter(environment.filters[name], name)
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    environment.globals["range"] = _bounded_range
    return environment


def _sized_filter(filter_function: Callable[..., object], name: str) -> Callable[..., object]:
    """A filter whose width or count arguments are held to the repeat limit ('x'|center(10**10)
    would build a string of 10 GB)."""

    def bounded(*args: object, **kwargs: object) -> object:
        limit = _current_budget().limits.repeat
        if any(isinstance(v, int) and abs(v) > limit for v in (*args[1:], *kwargs.values())):
            raise TemplateLimitReached(f"its {name} filter is given a size over {limit:,}")
        return filter_function(*args, **kwargs)

    bounded.jinja_pass_arg = getattr(filter_function, "jinja_pass_arg", None)  # type: ignore[attr-defined]
    return bounded


@lru_cache(maxsize=32)
def _compile(source: str, origin: str) -> Template:
    jinja2 = _jinja()
    from jinja2 import nodes

    if not source.strip():
        raise ValueError(
            f"{origin} is empty: a chat template must write the conversation; remove the empty "
            "file (zoo's default template is then used) or put the model's template in it"
        )
    if len(source) > MAX_TEMPLATE_CHARS:
        raise ValueError(
            f"{origin} refused: it is {len(source):,} characters long, past zoo's bound of "
            f"{MAX_TEMPLATE_CHARS:,} for a chat template; a real one is far shorter, so check "
            "that it is the template you meant"
        )
    environment = _environment()
    try:
        tree = environment.parse(source)
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(
            f"{origin} is not a valid Jinja template: {error.message} (line {error.lineno})"
        ) from None
    except RecursionError:  # Jinja's parser and compiler recurse once per nested expression
        raise ValueError(
            f"{origin} refused: it nests expressions or blocks too deeply to be parsed"
        ) from None
    for kind, tag in ((nodes.Include, "include"), (nodes.Import, "import"),
                      (nodes.FromImport, "from ... import"), (nodes.Extends, "extends")):  # fmt: skip
        found = next(iter(tree.find_all(kind)), None)
        if found is not None:
            raise ValueError(
                f"{origin} uses {{% {tag} %}} (line {found.lineno}): a chat template is rendered "
                "on its own, with no other template files; write the included text into it"
            )
    try:
        return environment.from_string(tree)
    except RecursionError:
        raise ValueError(
            f"{origin} refused: it nests expressions or blocks too deeply to be compiled"
        ) from None


@lru_cache(maxsize=32)
def _read_variables(source: str, origin: str) -> frozenset[str]:
    from jinja2 import meta

    _compile(source, origin)  # refuses what cannot be rendered, with its reason
    environment = _environment()
    filled = {"messages", "add_generation_prompt", "tools", "documents", *environment.globals}
    return frozenset(meta.find_undeclared_variables(environment.parse(source)) - filled)


def _strings(
    messages: Sequence[Mapping[str, object]], variables: Mapping[str, object]
) -> list[str]:
    values = [value for message in messages for value in message.values()]
    return [value for value in [*values, *variables.values()] if isinstance(value, str)]


def _unmark(marked: str, origin: str) -> tuple[str, list[tuple[int, int]]]:
    """The text without its generation marks, and the span each pair of marks enclosed."""
    pieces: list[str] = []
    spans: list[tuple[int, int]] = []
    length, start = 0, None
    for part in re.split(f"([{GENERATION_START}{GENERATION_END}])", marked):
        if part == GENERATION_START:
            if start is not None:
                raise ValueError(f"{origin}: a {{% generation %}} block is nested in another")
            start = length
        elif part == GENERATION_END:
            if start is None:  # a block's output cut in two by a filter or a string method
                raise ValueError(f"{origin}: a {{% generation %}} block's text was split")
            spans.append((start, length))
            start = None
        else:
            pieces.append(part)
            length += len(part)
    if start is not None:
        raise ValueError(f"{origin}: a {{% generation %}} block's text was split")
    return "".join(pieces), spans
