"""The floors of docs/architecture.md, read from the code: every import goes to the same floor
or down, no two files import each other through any path, and no library module imports the
`zoo` facade. A new top-level module or package must be given a floor here (and in the page)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "zoo"

# room (a top-level module or package of zoo) -> floor; docs/architecture.md draws the same
FLOORS = {
    "version": 0,
    "files": 0,
    "records": 0,
    "tree": 0,
    "host": 0,
    "extras": 0,
    "text": 0,
    "progress": 0,
    "nn": 1,
    "data": 1,
    "distributed": 1,
    "models": 2,
    "presets": 3,
    "tasks": 3,
    "inspection": 3,
    "decoding": 3,
    "serving": 4,
    "serialize": 4,
    "interop": 4,
    "train": 5,
    "lora": 6,
    "bench": 6,
    "demo": 6,
    "cli": 7,
    "__main__": 8,
    "__init__": 8,  # the facade: `import zoo` (its heavier names load lazily)
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports(path: Path) -> set[str]:
    """The zoo modules `path` imports, at the top or inside functions (`zoo` is the facade)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "zoo"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "zoo":
                continue
            for alias in node.names:  # `from zoo import presets` imports the module zoo.presets
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in MODULES else node.module)
    return found - {module_name(path)}


def graph() -> dict[str, set[str]]:
    return {module: imports(path) for module, path in MODULES.items()}


def test_every_room_has_a_floor():
    rooms = {room(module_name(path)) for path in PACKAGE.rglob("*.py")}
    assert rooms - set(FLOORS) == set(), "give the new module a floor here and in the docs"


def test_imports_go_down_or_stay_on_their_floor():
    upward = [
        f"{source} ({room(source)}, floor {FLOORS[room(source)]}) imports {target} "
        f"({room(target)}, floor {FLOORS[room(target)]})"
        for source, targets in graph().items()
        for target in sorted(targets)
        if FLOORS[room(target)] > FLOORS[room(source)]
    ]
    assert upward == []


def test_no_library_module_imports_the_facade():
    """Inside the library a name comes from the module that defines it, which go-to-definition
    follows; `zoo.something` through the facade hides it."""
    facade_users = [module for module, targets in graph().items() if "zoo" in targets]
    assert [module for module in facade_users if room(module) != "__main__"] == []


def test_no_two_modules_import_each_other():
    edges = graph()
    cycles = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    counter = [0]

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert cycles == []


def test_the_floors_match_the_architecture_page():
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for name, floor in FLOORS.items():
        if name in ("__init__", "__main__"):
            continue
        assert f"| {floor} |" in page and f"`{name}" in page, name
    by_floor = defaultdict(list)
    for name, floor in FLOORS.items():
        by_floor[floor].append(name)
    assert len(by_floor) == 9


# Sizes (docs/architecture.md, "Sizes the code is held to").
MAX_FILE_LINES = 500
MAX_PARAMETERS = 8
# Public calls whose keywords are spelled out flat on purpose (module:function, or
# module:Class.method), each with the reason.
PARAMETER_EXCEPTIONS: dict[str, str] = {
    "zoo.train.optim:adamw": "AdamW's hyperparameters, flat as in optax.adamw and torch's AdamW",
}


def parameter_count(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Every parameter but self/cls; `*args` and `**kwargs` count one each."""
    arguments = function.args
    names = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    count = len(names) + (arguments.vararg is not None) + (arguments.kwarg is not None)
    if names and names[0].arg in ("self", "cls"):
        count -= 1
    return count


def public_functions(path: Path):
    """(qualified name, node, class or None) of each public function and method of a module:
    names without a leading underscore (and `__init__` / `__call__`), in public classes, not
    nested in another function."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module = module_name(path)

    def walk(body, prefix, owner):
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                yield from walk(node.body, f"{prefix}{node.name}.", node)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                public = not node.name.startswith("_") or node.name in ("__init__", "__call__")
                if public:
                    yield f"{module}:{prefix}{node.name}", node, owner

    if any(part.startswith("_") and part != "__init__" for part in module.split(".")):
        return
    yield from walk(tree.body, "", None)


def test_no_file_is_over_the_line_limit():
    long_files = {
        str(path.relative_to(ROOT)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES
    }
    assert long_files == {}, f"split these files (at most {MAX_FILE_LINES} lines each)"


def test_no_public_function_takes_more_than_eight_parameters():
    crowded = {
        name: count
        for path in PACKAGE.rglob("*.py")
        for name, node, _ in public_functions(path)
        if (count := parameter_count(node)) > MAX_PARAMETERS and name not in PARAMETER_EXCEPTIONS
    }
    assert crowded == {}, "group the options into a record (docs/architecture.md)"


def test_public_functions_with_many_parameters_document_each_one():
    """Equinox's style: a call with more than six parameters lists every one under `Args:`."""
    undocumented = {}
    for path in PACKAGE.rglob("*.py"):
        for name, node, owner in public_functions(path):
            if parameter_count(node) <= 6:
                continue
            docstring = ast.get_docstring(node) or ""
            if node.name == "__init__" and owner is not None:  # the docs merge it into the class
                docstring = f"{ast.get_docstring(owner) or ''}\n{docstring}"
            arguments = node.args
            names = [
                a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)
            ]
            names += [a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None]
            missing = [
                n
                for n in names
                if n not in ("self", "cls") and not re.search(rf"^\s*\**{n}\b", docstring, re.M)
            ]
            if "Args:" not in docstring or missing:
                undocumented[name] = missing
    assert undocumented == {}


def test_the_limit_checks_see_what_they_should():
    source = (
        "class Public:\n    def method(self, a, b, *, c, **d): ...\n    def _hidden(self, a): ...\n"
    )
    tree = ast.parse(source)
    method = tree.body[0].body[0]
    assert parameter_count(method) == 4
    crowded = ast.parse("def f(a, b, c, d, e, f, g, h, i): ...").body[0]
    assert parameter_count(crowded) == 9


# Limits of the config tree and the typed core (docs/architecture.md, docs/configs.md).
MAX_CONFIG_FIELDS = 15  # TransformerConfig's own fields: the model's, beside its parts' records
MAX_STACK_LINES = 300
MAX_ANY_LINES = 300  # lines of zoo/ that name typing.Any


def test_the_config_keeps_few_fields_of_its_own():
    import dataclasses

    from zoo.models.config import TransformerConfig

    assert len(dataclasses.fields(TransformerConfig)) <= MAX_CONFIG_FIELDS


def test_the_stack_is_small_and_only_nn_reads_its_groups():
    stack = PACKAGE / "nn" / "stack.py"
    assert len(stack.read_text(encoding="utf-8").splitlines()) <= MAX_STACK_LINES
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "nn":
            continue
        text = path.read_text(encoding="utf-8")
        assert "group_layers" not in text and "stack_groups" not in text, path


def test_no_call_takes_loose_keywords_and_tasks_need_no_type_ignore():
    """Every public call's keywords are its signature's (no `**legacy` catch-all); the tasks read
    models through typed calls."""
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "**legacy" not in text and "legacy_keywords" not in text, path
        if path.parent.name == "tasks":
            assert "type: ignore" not in text, path


def test_few_lines_name_any():
    lines = [
        line
        for path in PACKAGE.rglob("*.py")
        for line in path.read_text(encoding="utf-8").splitlines()
        if re.search(r"\bAny\b", line)
    ]
    assert len(lines) < MAX_ANY_LINES
