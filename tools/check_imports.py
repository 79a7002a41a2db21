"""Check that the packages' imports follow the data: no cycle, and no arrow pointing back.

Run from a checkout: ``python -m tools.check_imports`` (exit 0 when clean, 1 with one line per
problem). It reads the source with :mod:`ast` and imports nothing, so it also checks modules
that need a running service to import. Every import counts: one inside a function, and one
under ``if TYPE_CHECKING:`` too (a cycle that only the type checker walks is still a knot in
the design, and the next refactor makes it real). There is no exemption.

The rules (README, "Architecture"):
- no cycle among modules;
- the foundation (``sidecar.errors``, ``sidecar.lifecycle``, ``sidecar.clock``, ``sidecar.version``,
  ``sidecar.text``) imports nothing of the application;
- ``sidecar.wire`` (what RAGFlow's processes write and the sidecar reads: headers, keys, the
  share's values, the evidence's read model) imports only the foundation and itself;
- ``sidecar.transport`` imports only itself, the foundation and the wire layer;
- ``sidecar.config`` imports only the foundation, wire, transport and itself;
  ``sidecar.telemetry`` only those and itself;
- the stages run mirror → shadow → observer → verdicts: a stage may import a later one (it
  hands its records on), never an earlier one, and no stage imports serve, cli, app or dev;
- only ``sidecar.cli`` and ``sidecar.dev`` import ``sidecar.dev`` (it is not in the wheel);
- ``comparators`` imports nothing of ``sidecar``;
- ``ragflow_mq`` (it runs inside RAGFlow's processes) imports only itself, the foundation, the
  wire layer, transport and config; and no module of ``sidecar`` imports ``ragflow_mq``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("sidecar", "comparators", "ragflow_mq")
FOUNDATION = (
    "sidecar.errors",
    "sidecar.lifecycle",
    "sidecar.clock",
    "sidecar.text",
    "sidecar.version",
)
WIRE = "sidecar.wire"
STAGES = ("sidecar.mirror", "sidecar.shadow", "sidecar.observer", "sidecar.verdicts")
BELOW_STAGES = (*FOUNDATION, WIRE, "sidecar.transport", "sidecar.config", "sidecar.telemetry")
ALLOWED: dict[str, tuple[str, ...]] = {
    WIRE: (*FOUNDATION, WIRE),
    "sidecar.transport": (*FOUNDATION, WIRE, "sidecar.transport"),
    "sidecar.config": (*FOUNDATION, WIRE, "sidecar.transport", "sidecar.config"),
    "sidecar.telemetry": (
        *FOUNDATION,
        WIRE,
        "sidecar.transport",
        "sidecar.config",
        "sidecar.telemetry",
    ),
    "comparators": ("comparators",),
    "ragflow_mq": ("ragflow_mq", *FOUNDATION, WIRE, "sidecar.transport", "sidecar.config"),
}


@dataclass
class Graph:
    """Module name → the project modules it imports."""

    edges: dict[str, set[str]] = field(default_factory=dict)


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, wherever it stands."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def build_graph(root: Path, packages: Iterable[str] = PACKAGES) -> Graph:
    """The import graph of ``packages`` under ``root``, project modules only."""
    sources = {
        _module_name(root, path): path
        for package in packages
        for path in sorted((root / package).rglob("*.py"))
    }
    graph = Graph({name: set() for name in sources})
    for name, path in sources.items():
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, name, is_package):
                # `from a.b import c` imports a.b.c when c is a module, else a name in a.b.
                found = next((t for t in (target, target.rpartition(".")[0]) if t in sources), None)
                if found is not None and found != name:
                    graph.edges[name].add(found)
    return graph


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return [f"{base}.{alias.name}" for alias in node.names]


def cycles(graph: Graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.edges.get(node, ())):
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
                found.append(sorted(component))

    for node in sorted(graph.edges):
        if node not in index:
            visit(node)
    return found


def _stage(module: str) -> int | None:
    return next((i for i, stage in enumerate(STAGES) if _under(module, stage)), None)


def layer_problems(graph: Graph) -> list[str]:
    """One line per import that points against the flow."""
    problems = []
    for source, targets in sorted(graph.edges.items()):
        for target in sorted(targets):
            reason = _against_the_flow(source, target)
            if reason:
                problems.append(f"{source} imports {target}: {reason}")
    return problems


def _against_the_flow(source: str, target: str) -> str | None:
    if target == "sidecar":
        return None  # the package root: the version, and public names loaded on first use
    if _under(source, "sidecar") and _under(target, "ragflow_mq"):
        return "the sidecar never imports ragflow_mq: both stand on sidecar.wire"
    for scope, allowed in ALLOWED.items():
        if _under(source, scope) and not any(_under(target, a) for a in allowed):
            return f"{scope} may import only {', '.join(allowed)}"
    if _under(target, "sidecar.dev") and not (
        _under(source, "sidecar.dev") or _under(source, "sidecar.cli")
    ):
        return "sidecar.dev is development tooling, not in the wheel"
    source_stage, target_stage = _stage(source), _stage(target)
    if source_stage is not None:
        if target_stage is not None and target_stage < source_stage:
            return f"{STAGES[source_stage]} comes after {STAGES[target_stage]} in the flow"
        below = any(_under(target, b) for b in (*BELOW_STAGES, "comparators"))
        if target_stage is None and not below:
            return "a stage imports only later stages and the layers below them"
    foundation = any(_under(source, low) for low in FOUNDATION)
    if foundation and _under(target, "sidecar") and not any(_under(target, f) for f in FOUNDATION):
        return "the foundation imports nothing of the application"
    return None


def check(root: Path) -> list[str]:
    """Every problem in the tree under ``root``: cycles first, then arrows against the flow."""
    graph = build_graph(root)
    problems = [f"import cycle: {' -> '.join(component)}" for component in cycles(graph)]
    return problems + layer_problems(graph)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else Path(__file__).resolve().parent.parent
    problems = check(root)
    for line in problems:
        print(line)
    if not problems:
        modules = len(build_graph(root).edges)
        print(f"imports follow the flow: {modules} modules, no cycle")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
