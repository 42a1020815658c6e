"""docs/design.md's package map is the code's: every module is listed, and no room imports a
room its row does not name (imports under TYPE_CHECKING aside). A new module or a new import
between rooms is a change to the map in the same commit."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "gpu_exporter"
DESIGN = (ROOT / "docs" / "design.md").read_text()
MAP = DESIGN.split("## Package map", 1)[1].split("\n## ", 1)[0]
TABLE = dict(
    (room, set(re.findall(r"`([a-z_]+)`", allowed)))
    for room, allowed in re.findall(r"^\| `([a-z_]+)` \| [^|]+ \|([^|]*)\|$", MAP, re.M)
)
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "_pb2" not in p.name)


def room_of(module: str) -> str:
    """``gpu_exporter.xid.core`` -> ``xid``."""
    return module.split(".")[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_rooms(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(sub) for sub in ast.walk(node))
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    rooms = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
                targets = [module] + [f"{module}.{a.name}" for a in node.names]
            else:
                targets = [node.module or ""]
        rooms.update(room_of(t) for t in targets if t.startswith("gpu_exporter.") and t.count("."))
    return {room for room in rooms if not room.startswith("__")}  # the package top: __version__


def test_every_room_imports_only_what_its_row_names() -> None:
    problems = []
    for path in MODULES:
        name = module_name(path)
        if name.count(".") == 0 or name == "gpu_exporter.__main__":
            continue  # the package top and python -m
        room = room_of(name)
        assert room in TABLE, f"{name}: its room {room!r} has no row in docs/design.md's map"
        extra = imported_rooms(path) - TABLE[room] - {room}
        if extra:
            problems.append(f"{name} imports {', '.join(sorted(extra))}")
    assert not problems, "imports the package map does not allow: " + "; ".join(problems)


def test_every_module_is_in_the_map() -> None:
    section = MAP.split("Modules, room by room:", 1)[1]
    bullets = re.split(r"\n(?=- )", section)
    missing = []
    for path in MODULES:
        relative = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py" and "/" in relative:
            continue  # a package: its room's bullet and docstring speak for it
        room = relative.split("/", 1)[0] if "/" in relative else None
        if f"`{relative}`" in section:
            continue
        mine = [b for b in bullets if room is not None and f"`{room}/" in b]
        if any(f"`{path.name}`" in b or f"`{relative.split('/', 1)[1]}`" in b for b in mine):
            continue
        missing.append(relative)
    assert not missing, f"modules docs/design.md's package map does not list: {missing}"


def imported_modules(path: Path) -> set[str]:
    """Every ``gpu_exporter`` module ``path`` imports, wherever the import stands: a type-only
    (``TYPE_CHECKING``) or a function-level import ties two modules together as much as any."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def test_no_module_imports_itself_back() -> None:
    """No import cycle anywhere in the package, the simulator included."""
    names = {module_name(path): path for path in MODULES}
    edges = {
        name: {m for m in imported_modules(path) if m in names and m != name}
        for name, path in names.items()
    }
    for name in edges:  # a package's __init__ re-exports its modules: not a tie back to them
        edges[name] -= {m for m in edges[name] if name.startswith(f"{m}.")}
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles: " + "; ".join(cycles)


# The walks a newcomer follows through the code: each numbered step names modules (``x/y.py``)
# and, beside them, what to look for there.
WALKS = ("An NVML sample to /metrics bytes",)
_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?")


def defined_names(path: Path) -> tuple[set[str], dict[str, set[str]]]:
    """What a module defines or imports at its top, and each of its classes' members (methods,
    class attributes and what the methods assign to ``self``)."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    classes: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        if isinstance(node, ast.ClassDef):
            members = classes[node.name] = set()
            for sub in ast.walk(node):
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                    members.add(sub.name)
                elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                    members.add(sub.target.id)
                elif isinstance(sub, ast.Assign):
                    members.update(t.id for t in sub.targets if isinstance(t, ast.Name))
                    members.update(
                        t.attr
                        for t in sub.targets
                        if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self"
                    )
    return names, classes


def walk_steps(title: str) -> list[str]:
    section = DESIGN.split(f"### {title}\n", 1)[1].lstrip("\n")
    steps = re.split(r"\n(?=\d+\. )", section.split("\n\n", 1)[0])
    return [step for step in steps if re.match(r"\d+\. ", step)]


def walk_problems(step: str) -> list[str]:
    """What ``step`` names that the code does not have where the step says."""
    problems: list[str] = []
    tokens = re.findall(r"`([^`]+)`", step)
    modules = [PACKAGE / t for t in tokens if t.endswith(".py")]
    problems += [f"no module {m.relative_to(PACKAGE)}" for m in modules if not m.is_file()]
    here = [defined_names(m) for m in modules if m.is_file()]
    everywhere = {module_name(p).removeprefix("gpu_exporter."): p for p in MODULES}
    for token in tokens:
        if token.endswith((".py", "/")) or not _NAME.fullmatch(token):
            continue  # a module, a room, a flag or an expression
        owner, _, member = token.rpartition(".")
        if owner in everywhere:  # module.name
            found = member in defined_names(everywhere[owner])[0]
        elif owner:  # Class.member: the class wherever it is defined
            found = any(
                member in defined_names(p)[1].get(owner, set()) for p in everywhere.values()
            )
        else:
            found = any(token in names or any(token in m for m in c.values()) for names, c in here)
        if not found:
            named = ", ".join(t for t in tokens if t.endswith(".py"))
            problems.append(f"{token} is not in {named}")
    return problems


def test_the_walks_name_modules_that_hold_what_each_step_says() -> None:
    problems = []
    for title in WALKS:
        steps = walk_steps(title)
        assert steps, f"docs/design.md has no numbered walk '{title}'"
        for number, step in enumerate(steps, 1):
            problems += [f"{title}, step {number}: {p}" for p in walk_problems(step)]
    assert not problems, "docs/design.md's walks disagree with the code: " + "; ".join(problems)
