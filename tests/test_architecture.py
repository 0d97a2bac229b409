"""The tree is the architecture diagram: these tests keep it that way.

Every import between lmbridge's own modules counts — at the top of a module, inside a function, under
``TYPE_CHECKING`` — and each goes down the layers of ``LAYERS`` (or stays inside its own package). No cycles.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bridge", "session", "mcp_synthetic")

# Lowest first. A module may import modules of its own package and of lower layers only.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("bridge", "bridge.errors", "bridge.config", "bridge.observe", "bridge.acp.vocabulary")),
    ("wire", ("bridge.rpc",)),
    ("acp client", ("bridge.acp",)),
    ("sessions and tools", ("session", "mcp_synthetic")),
    ("core", ("bridge.core",)),
    ("fronts", ("bridge.editor", "bridge.http")),
    ("shells", ("bridge.daemon",)),
    ("harness", ("bridge.harness",)),
    ("command line", ("bridge.cli", "bridge.__main__")),
]
# The demo agent runs in a process of its own: the bridge never imports it, it imports only what it shares.
DEMO = "bridge.demo"
DEMO_MAY_IMPORT = ("bridge", "bridge.acp.vocabulary", "session.transcript")
FRONTS = ("bridge.editor", "bridge.http")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


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


def _layer(module: str) -> int:
    best, rank = -1, -1
    for index, (_label, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), index
    assert rank >= 0, f"{module} is in no layer: add it to LAYERS"
    return rank


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


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


def test_dependencies_point_down_the_layers() -> None:
    wrong = []
    for module, targets in sorted(GRAPH.items()):
        if module == DEMO or module.startswith(DEMO + "."):
            continue
        for target in sorted(targets):
            if target == DEMO or target.startswith(DEMO + "."):
                wrong.append(f"{module} → {target} (nothing imports the demo agent: it is a process of its own)")
            elif _package(target) != _package(module) and _layer(target) > _layer(module):
                wrong.append(f"{module} ({LAYERS[_layer(module)][0]}) → {target} ({LAYERS[_layer(target)][0]})")
    assert wrong == []


def test_nothing_below_the_shells_imports_a_front() -> None:
    shells = _layer("bridge.daemon")
    wrong = [
        f"{module} → {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if target.startswith(FRONTS)
        and not module.startswith(FRONTS)
        and _layer(module) < shells
        and not module.startswith(DEMO)
    ]
    assert wrong == []


def test_the_demo_agent_imports_only_what_it_shares() -> None:
    wrong = [
        f"{module} → {target}"
        for module, targets in GRAPH.items()
        if module.startswith(DEMO)
        for target in targets
        if not target.startswith(DEMO) and target not in DEMO_MAY_IMPORT
    ]
    assert wrong == []


def test_bridge_root_holds_at_most_four_modules_and_a_package_per_concern() -> None:
    root = ROOT / "bridge"
    modules = sorted(p.name for p in root.glob("*.py"))
    packages = sorted(p.name for p in root.iterdir() if (p / "__init__.py").is_file())
    assert len(modules) <= 4, modules
    assert len(packages) >= 4, packages


@pytest.mark.parametrize("package", sorted(m for m, p in MODULES.items() if p.name == "__init__.py"))
def test_every_package_says_what_it_owns(package: str) -> None:
    docstring = ast.get_docstring(ast.parse(MODULES[package].read_text()))
    assert docstring and len(docstring) > 40, (
        f"{package}/__init__.py needs a docstring: what it owns, what it may import"
    )
