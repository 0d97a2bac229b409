"""The tree is the architecture diagram: these tests keep it that way.

Every import between lmbridge's own modules counts — at the top of a module, inside a function, under
``TYPE_CHECKING``. The top-level packages are floors (``wire`` at the bottom, ``session`` and ``mcp_synthetic`` on it,
``bridge`` on top) and every import between them points down. Each package says in its ``__init__`` docstring what it
may import (``May import: ...``, the names in double backquotes): a module may import its own package's modules, the
packages above it in its own path (Python imports them anyway), and what its package names — nothing else. No cycles.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLOORS = ("wire", ("session", "mcp_synthetic"), "bridge")  # lowest first
TOP_LEVEL = ("wire", "session", "mcp_synthetic", "bridge")
DEMO = "bridge.demo"  # a process of its own: nothing imports it
FRONTS = ("bridge.editor", "bridge.http")


def _modules() -> dict[str, Path]:
    found = {}
    for package in TOP_LEVEL:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()
PACKAGES = sorted(name for name, path in MODULES.items() if path.name == "__init__.py")


def _package_of(module: str) -> str:
    """The innermost package holding ``module`` (a package is its own)."""
    return module if module in PACKAGES else module.rsplit(".", 1)[0]


def _imports(name: str, path: Path) -> set[str]:
    """The project modules ``name`` imports, anywhere in its text."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            # ``from package import module`` imports the module; ``from module import name`` the module itself.
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module for alias in node.names
            ]
        else:
            continue
        out.update(target for target in targets if target in MODULES and target != name)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}

_MAY_IMPORT = re.compile(r"May import:(.*?)(?:\.\s|\.$|\n\n|$)", re.S)


def _allowed(package: str) -> tuple[str, ...]:
    """What ``package``'s docstring says it may import: the lmbridge names in its ``May import:`` sentence."""
    docstring = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
    found = _MAY_IMPORT.search(docstring)
    if found is None:
        return ()
    names = re.findall(r"``([a-z_][a-z0-9_.]*)``", found.group(1))
    return tuple(name for name in names if name.split(".")[0] in TOP_LEVEL)


ALLOWED = {package: _allowed(package) for package in PACKAGES}


def _floor(module: str) -> int:
    top = module.split(".")[0]
    return next(i for i, floor in enumerate(FLOORS) if top == floor or top in floor)


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_no_import_cycles() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = iter(range(10**6))

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = next(counter)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
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

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert cycles == []


def test_every_import_between_top_level_packages_points_down() -> None:
    wrong = [
        f"{module} → {target}"
        for module, targets in sorted(GRAPH.items())
        for target in sorted(targets)
        if module.split(".")[0] != target.split(".")[0] and _floor(target) >= _floor(module)
    ]
    assert wrong == []


def test_every_import_is_one_its_package_names() -> None:
    wrong = []
    for module, targets in sorted(GRAPH.items()):
        package = _package_of(module)
        for target in sorted(targets):
            own = _package_of(target) == package
            above = target in PACKAGES and _within(module, target)  # a package on the module's own path
            named = any(_within(target, allowed) for allowed in ALLOWED[package])
            if not (own or above or named):
                wrong.append(f"{module} → {target} ({package} may import: {', '.join(ALLOWED[package]) or 'nothing'})")
    assert wrong == []


def test_every_name_in_an_allow_list_exists_and_is_below_or_beside_it() -> None:
    wrong = []
    for package, allowed in ALLOWED.items():
        for name in allowed:
            if name not in MODULES:
                wrong.append(f"{package} names {name}, which is no module of lmbridge")
            elif _floor(name) > _floor(package):
                wrong.append(f"{package} names {name}, a floor above it")
    assert wrong == []


def test_nothing_below_the_shells_imports_a_front() -> None:
    # The fronts are imported by the shells (bridge.daemon), the command line and the harness (the editor client).
    may = ("bridge.daemon", "bridge.cli", "bridge.harness", *FRONTS)
    wrong = [
        f"{module} → {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if target.startswith(FRONTS) and not module.startswith(may)
    ]
    assert wrong == []


def test_nothing_imports_the_demo_agent() -> None:
    wrong = [
        f"{module} → {target}"
        for module, targets in GRAPH.items()
        if not _within(module, DEMO)
        for target in targets
        if _within(target, DEMO)
    ]
    assert wrong == []


def test_bridge_root_holds_at_most_three_modules_and_a_package_per_concern() -> None:
    root = ROOT / "bridge"
    modules = sorted(p.name for p in root.glob("*.py"))
    packages = sorted(p.name for p in root.iterdir() if (p / "__init__.py").is_file())
    assert len(modules) <= 3, modules
    assert len(packages) >= 4, packages


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_says_what_it_owns_and_may_import(package: str) -> None:
    docstring = ast.get_docstring(ast.parse(MODULES[package].read_text()))
    assert docstring and len(docstring) > 40, f"{package}/__init__.py needs a docstring: what it owns, may import"
    assert "May import:" in docstring, f"{package}/__init__.py: say what it may import (May import: ...)"


def test_the_allow_lists_are_read() -> None:
    """The test reads what the docstrings say (a docstring the pattern missed would allow nothing, and fail above)."""
    assert ALLOWED["session"] == ("wire.errors", "wire.vocabulary", "wire.cancel", "wire.observe.logger")
    assert ALLOWED["wire"] == ()
    assert "bridge.acp" in ALLOWED["bridge.service"]
