"""The gateway's packages import one way: HTTP surfaces on top, the execution core at the bottom, no cycles.

Imports are read with `ast` (lazy imports inside functions included), so a cycle cannot hide behind a
function-level import that only breaks at run time.
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
PACKAGES = sorted(p.name for p in GATEWAY.iterdir() if (p / "__init__.py").is_file())


def _module(path: Path) -> list[str]:
    parts = list(path.relative_to(GATEWAY.parent).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imported(path: Path) -> set[str]:
    """Dotted names of the `gateway` modules (or packages) one file imports."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = base + (node.module.split(".") if node.module else [])
            out.add(".".join(target))
            out.update(".".join([*target, alias.name]) for alias in node.names)  # `from . import x`: x a module
    return {name for name in out if name.startswith("gateway.")}


def package_graph() -> dict[str, set[str]]:
    """Edges between gateway's sub-packages: A → B (B in graph[A]) when a module of A imports one of B."""
    graph: dict[str, set[str]] = {name: set() for name in PACKAGES}
    for path in GATEWAY.rglob("*.py"):
        parts = _module(path)
        if len(parts) < 3 or parts[1] not in PACKAGES:
            continue
        for name in _imported(path):
            target = name.split(".")[1]
            if target in PACKAGES and target != parts[1]:
                graph[parts[1]].add(target)
    return graph


def test_the_sub_packages_the_checks_rely_on_exist() -> None:
    assert {"surfaces", "decisions", "images", "videos", "text", "execution"} <= set(PACKAGES)


def test_gateway_sub_packages_import_each_other_without_a_cycle() -> None:
    try:
        order = list(TopologicalSorter(package_graph()).static_order())
    except CycleError as exc:
        raise AssertionError(f"gateway packages import each other in a cycle: {' → '.join(exc.args[1])}") from None
    assert sorted(order) == PACKAGES


def test_the_execution_core_imports_no_package_above_it() -> None:
    above = {"surfaces", "decisions", "images", "videos"}
    assert package_graph()["execution"] & above == set()


def test_no_gateway_sub_package_imports_the_http_surfaces_above_it() -> None:
    assert sorted(name for name, imports in package_graph().items() if "surfaces" in imports) == []
