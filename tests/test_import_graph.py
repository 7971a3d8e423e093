"""The package's imports form a graph with no cycles, and its edges run one way, down the layers.

The exporter is layered, each layer importing only the ones below it:

    cli -> http -> collectors -> monitor -> backends / attribution / host -> samples

with ``config``, ``logs`` and ``version`` as leaves beside ``samples`` that anything may import
and that import nothing of ours but each other. Keeping it that way is what lets a backend or a
collector be imported and tested without the HTTP server and the CLI, and keeps a package's
``__init__`` from being half-initialised when one of its submodules is imported first (the usual
symptom of an import cycle: ``ImportError: cannot import name ... (most likely due to a circular
import)``). A cycle or an upward import often works until someone reorders imports or moves one
to the top of a file, so it is checked here, statically, rather than waiting for it to break.

The graph is read with ``ast`` from every ``*.py`` under ``exporter/``, nothing is imported:
every ``import`` and ``from ... import`` anywhere in a file counts, including the ones inside
functions and inside ``if TYPE_CHECKING:`` (a type-only import is still a dependency, and the
next refactor turns it into a runtime one). Relative imports are resolved against the module's
package, and the absolute names ``exporter.`` and ``resmon_exporter.`` both mean this package.
A module's name is its path under ``exporter/`` (``backends/nvml/__init__.py`` is
``backends.nvml``); the package's own ``__init__`` is ``<root>``. An edge to a package is an edge
to its ``__init__``; the parent packages a submodule import initialises are not edges.
The rules name top-level packages that may not exist yet: a rule about a missing one holds
vacuously. ``<root>`` re-exports the public API, so it is exempt from the layer rules, but not
from the cycle check.
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "exporter"
PACKAGE_NAMES = frozenset({"exporter", "resmon_exporter"})  # the source folder and the import name
ROOT = "<root>"

# module -> imported module -> the lines that import it
Graph = Mapping[str, Mapping[str, Sequence[int]]]
Parts = tuple[str, ...]

LEAVES = ("samples", "logs", "version", "config")
LOWER = ("backends", "attribution", "host", "samples", "counters", "accounting", "logs", "config", "version")
# The NVML backend in rooms (backend.py composes them; docs/architecture.md): nothing else in
# backends.nvml imports one, so a room never reaches up into the backend or sideways into another
NVML_ROOMS = ("backends.nvml.backend", "backends.nvml.session", "backends.nvml.registry", "backends.nvml.gpu_read")


# -- reading the package --------------------------------------------------------------------


def module_parts(path: Path, package_dir: Path) -> Parts:
    """``collectors/gpu.py`` -> ("collectors", "gpu"); ``backends/nvml/__init__.py`` -> ("backends", "nvml")."""
    parts = path.relative_to(package_dir).with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def dotted(parts: Parts) -> str:
    return ".".join(parts) if parts else ROOT


def package_of(path: Path, parts: Parts) -> Parts:
    """The package relative imports resolve against: an ``__init__`` is its own package."""
    return parts if path.name == "__init__.py" else parts[:-1]


def absolute_parts(name: str) -> Parts | None:
    """``exporter.a.b`` or ``resmon_exporter.a.b`` -> ("a", "b"); None for another package."""
    head, *rest = name.split(".")
    return tuple(rest) if head in PACKAGE_NAMES else None


def from_base(node: ast.ImportFrom, package: Parts) -> Parts | None:
    """The module a ``from X import ...`` names, as parts, or None when X is not ours."""
    if node.level == 0:
        return absolute_parts(node.module or "")
    up = node.level - 1
    if up > len(package):  # beyond the top-level package: not an import of ours
        return None
    base = package[: len(package) - up]
    return base + tuple(node.module.split(".")) if node.module else base


def import_targets(node: ast.AST, package: Parts, modules: frozenset[Parts]) -> Iterator[Parts]:
    """The modules one import statement imports from this package."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            parts = absolute_parts(alias.name)
            if parts is not None:
                yield parts
    elif isinstance(node, ast.ImportFrom):
        base = from_base(node, package)
        if base is None:
            return
        for alias in node.names:
            # `from pkg import sub` imports the submodule when there is one, else a name of pkg
            yield base + (alias.name,) if base + (alias.name,) in modules else base


def find_modules(package_dir: Path) -> dict[Parts, Path]:
    return {module_parts(path, package_dir): path for path in sorted(package_dir.rglob("*.py"))}


def file_edges(path: Path, parts: Parts, modules: frozenset[Parts]) -> dict[str, list[int]]:
    tree = ast.parse(path.read_bytes(), filename=str(path))
    package = package_of(path, parts)
    edges: dict[str, list[int]] = {}
    for node in ast.walk(tree):
        for target in import_targets(node, package, modules):
            edges.setdefault(dotted(target), []).append(node.lineno)
    return {target: sorted(set(lines)) for target, lines in sorted(edges.items())}


@dataclass(frozen=True)
class PackageGraph:
    edges: dict[str, dict[str, list[int]]]
    files: dict[str, str]  # module -> its file, as ``exporter/backends/base.py``

    def __repr__(self) -> str:  # pytest prints the fixture in a failure: keep it short
        return f"PackageGraph({len(self.edges)} modules, {sum(map(len, self.edges.values()))} edges)"


def build_graph(package_dir: Path) -> PackageGraph:
    modules = find_modules(package_dir)
    known = frozenset(modules)
    edges = {dotted(parts): file_edges(path, parts, known) for parts, path in modules.items()}
    files = {dotted(parts): path.relative_to(package_dir.parent).as_posix() for parts, path in modules.items()}
    return PackageGraph(edges=edges, files=files)


# -- cycles ---------------------------------------------------------------------------------


def successors(graph: Graph) -> dict[str, list[str]]:
    """Every node (importers and imported) with its targets; self-edges dropped."""
    nodes = set(graph) | {target for targets in graph.values() for target in targets}
    return {node: sorted(set(graph.get(node, {})) - {node}) for node in sorted(nodes)}


def strongly_connected_components(graph: Graph) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit); each component sorted."""
    succ = successors(graph)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)

    for start in succ:
        if start in index:
            continue
        visit(start)
        work: list[tuple[str, Iterator[str]]] = [(start, iter(succ[start]))]
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    visit(target)
                    work.append((target, iter(succ[target])))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return sorted(components)


def shortest_path(succ: Mapping[str, Sequence[str]], start: str, goal: str, within: set[str]) -> list[str]:
    """Breadth-first, inside one component (where a path always exists)."""
    came_from: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            break
        for target in succ[node]:
            if target in within and target not in came_from:
                came_from[target] = node
                queue.append(target)
    path = [goal]
    while (previous := came_from[path[-1]]) is not None:
        path.append(previous)
    return path[::-1]


def rotated(cycle: Sequence[str]) -> tuple[str, ...]:
    """The same cycle starting from its smallest node, so that rotations compare equal."""
    first = cycle.index(min(cycle))
    return tuple(cycle[first:]) + tuple(cycle[:first])


def find_cycles(graph: Graph) -> list[tuple[str, ...]]:
    """For every edge that lies on a cycle, the shortest cycle through it (deduplicated).

    Not every elementary cycle (there can be exponentially many), but every edge that has to
    go for the package to be acyclic shows up in at least one of them.
    """
    succ = successors(graph)
    cycles: set[tuple[str, ...]] = set()
    for component in strongly_connected_components(graph):
        if len(component) < 2:
            continue
        members = set(component)
        for source in component:
            for target in succ[source]:
                if target in members:
                    cycles.add(rotated([source, *shortest_path(succ, target, source, members)[:-1]]))
    return sorted(cycles, key=lambda cycle: (len(cycle), cycle))


def describe_cycle(cycle: Sequence[str], graph: Graph, files: Mapping[str, str]) -> str:
    closed = [*cycle, cycle[0]]
    lines = ["  " + " -> ".join(closed)]
    for source, target in zip(closed, closed[1:]):
        lines.append(f"      {source} -> {target}: {where(source, graph[source][target], files)}")
    return "\n".join(lines)


# -- layer rules ----------------------------------------------------------------------------


def under(module: str, *prefixes: str) -> bool:
    """``collectors.gpu`` is under ``collectors``; so is ``collectors`` itself; ``collector`` is not."""
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


@dataclass(frozen=True)
class Rule:
    description: str
    applies_to: Callable[[str], bool]  # the importing module
    forbids: Callable[[str], bool]  # the imported module


RULES: tuple[Rule, ...] = (
    Rule(
        "nothing but cli and __main__ imports cli",
        lambda module: not under(module, "cli", "__main__"),
        lambda target: under(target, "cli"),
    ),
    Rule(
        "collectors import nothing under http or cli",
        lambda module: under(module, "collectors"),
        lambda target: under(target, "http", "cli"),
    ),
    Rule(
        "backends, attribution, host, samples, counters, accounting, logs, config, version import nothing "
        "under collectors, http, cli or monitor",
        lambda module: under(module, *LOWER),
        lambda target: under(target, "collectors", "http", "cli", "monitor"),
    ),
    Rule(
        "samples, logs, version, config are leaves: they import nothing of the package but each other",
        lambda module: under(module, *LEAVES),
        lambda target: not under(target, *LEAVES),
    ),
    Rule(
        "backends do not import attribution",
        lambda module: under(module, "backends"),
        lambda target: under(target, "attribution"),
    ),
    Rule(
        "attribution does not import backends",
        lambda module: under(module, "attribution"),
        lambda target: under(target, "backends"),
    ),
    Rule(
        "monitor imports nothing under collectors, http or cli",
        lambda module: under(module, "monitor"),
        lambda target: under(target, "collectors", "http", "cli"),
    ),
    Rule(
        "the NVML backend's rooms: within backends.nvml only backend imports session, registry or "
        "gpu_read, and nothing imports backend (the rooms and the modules below them import down only)",
        lambda module: under(module, "backends.nvml") and module != "backends.nvml.backend",
        lambda target: target in NVML_ROOMS,
    ),
)


@dataclass(frozen=True)
class Violation:
    rule: str
    module: str
    target: str
    lines: Sequence[int]


def check_rules(graph: Graph, rules: Iterable[Rule] = RULES) -> list[Violation]:
    """Every edge that breaks a rule; the root ``__init__`` (the public API) is exempt."""
    found: list[Violation] = []
    for rule in rules:
        for module in sorted(graph):
            if module == ROOT or not rule.applies_to(module):
                continue
            for target, lines in sorted(graph[module].items()):
                if target != module and rule.forbids(target):
                    found.append(Violation(rule.description, module, target, lines))
    return found


def where(module: str, lines: Sequence[int], files: Mapping[str, str]) -> str:
    """``exporter/cli.py:13, 82``; the module's name stands in when the graph is not from files."""
    return f"{files.get(module, module)}:{', '.join(map(str, lines))}"


def describe_violations(violations: Sequence[Violation], files: Mapping[str, str]) -> str:
    lines: list[str] = []
    for rule in dict.fromkeys(violation.rule for violation in violations):
        lines.append(f"  {rule}:")
        for violation in violations:
            if violation.rule == rule:
                numbers = ", ".join(map(str, violation.lines))
                file = files.get(violation.module, violation.module)
                lines.append(f"      {violation.module} imports {violation.target} (line {numbers}, {file})")
    return "\n".join(lines)


# -- the tests ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def package() -> PackageGraph:
    return build_graph(PACKAGE_DIR)


def test_the_package_has_no_import_cycle(package: PackageGraph) -> None:
    cycles = find_cycles(package.edges)
    assert not cycles, "import cycles in exporter/ (under each, where each edge is imported):\n" + "\n".join(
        describe_cycle(cycle, package.edges, package.files) for cycle in cycles
    )


def test_imports_run_one_way(package: PackageGraph) -> None:
    violations = check_rules(package.edges)
    assert not violations, (
        "imports against the layers (cli -> http -> collectors -> monitor -> backends / attribution / host"
        " -> samples; config, logs, version leaves):\n" + describe_violations(violations, package.files)
    )


def check_the_checkers() -> None:
    """The cycle finder and the rule checker on a small graph whose answers are known."""
    graph: dict[str, dict[str, list[int]]] = {
        ROOT: {"cli": [1], "monitor": [2]},  # exempt from the rules
        "cli": {"http.server": [3], "cli": [4]},  # a self-edge: no cycle
        "http.server": {"collectors.gpu": [5]},
        "collectors.gpu": {"http.server": [6], "samples": [7]},  # a cycle, and an upward import
        "monitor": {"backends.nvml": [8]},
        "backends.nvml": {"samples": [9]},
        "samples": {"logs": [10]},
        "logs": {},
    }
    assert find_cycles(graph) == [("collectors.gpu", "http.server")]
    assert check_rules(graph) == [Violation(RULES[1].description, "collectors.gpu", "http.server", [6])]

    acyclic = {**graph, "collectors.gpu": {"samples": [7]}}
    assert find_cycles(acyclic) == []
    assert check_rules(acyclic) == []


def test_the_nvml_rooms_rule_catches_a_room_importing_up_or_sideways() -> None:
    """The NVML backend's rooms (backend.py composes session, registry and gpu_read) on a
    small graph: the backend importing a room is the one allowed direction."""
    graph = {
        "backends.nvml.backend": {"backends.nvml.session": [1], "backends.nvml.registry": [2], "backends.nvml.errors": [3]},
        "backends.nvml.registry": {"backends.nvml.backend": [4], "backends.nvml.errors": [5]},  # up: against the rule
        "backends.nvml.session": {"backends.nvml.gpu_read": [6]},  # sideways: against the rule
        "backends.nvml.errors": {},
    }
    rule = next(r for r in RULES if "NVML backend's rooms" in r.description)
    assert check_rules(graph, [rule]) == [
        Violation(rule.description, "backends.nvml.registry", "backends.nvml.backend", [4]),
        Violation(rule.description, "backends.nvml.session", "backends.nvml.gpu_read", [6]),
    ]


def test_the_walk_sees_the_package(package: PackageGraph) -> None:
    check_the_checkers()  # first: so that a pass below cannot come from checkers that find nothing
    graph = package.edges
    assert len(graph) >= 30, f"the walk found only {len(graph)} modules under {PACKAGE_DIR}"
    monitor_edges = {target for module in graph if under(module, "monitor") for target in graph[module]}
    assert monitor_edges, f"no imports found in monitor: {sorted(graph)}"
    assert any(under(target, "backends") for target in monitor_edges), (
        f"monitor should import the backends; it imports {sorted(monitor_edges)}"
    )


def test_the_cycle_finder_reports_every_edge_on_a_cycle() -> None:
    # two cycles sharing "a", plus a three-cycle: one component, every edge in some reported cycle
    graph = {"a": {"b": [1], "c": [2]}, "b": {"a": [3]}, "c": {"d": [4]}, "d": {"a": [5]}, "e": {"a": [6]}}
    assert strongly_connected_components(graph) == [["a", "b", "c", "d"], ["e"]]
    assert find_cycles(graph) == [("a", "b"), ("a", "c", "d")]
    assert describe_cycle(("a", "b"), graph, {}) == "  a -> b -> a\n      a -> b: a:1\n      b -> a: b:3"


def test_imports_are_resolved_like_python_does(tmp_path: Path) -> None:
    sources = {
        "__init__.py": "from .monitor import M\nfrom . import version\n",
        "version.py": "",
        "monitor.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .cli import C\n"
        "def f():\n    import resmon_exporter.backends.nvml\n",
        "cli.py": "import exporter\nfrom exporter import version, thing\nimport os\n",
        "backends/__init__.py": "from . import nvml, Options\nfrom ..samples import S\n",
        "backends/nvml/__init__.py": "from .. import Options\nfrom . import fields\nfrom ... import x\n",
        "backends/nvml/fields.py": "from ...logs import f\nfrom .... import too_far\n",
    }
    for name, text in sources.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert build_graph(tmp_path).edges == {
        ROOT: {"monitor": [1], "version": [2]},
        "backends": {"backends": [1], "backends.nvml": [1], "samples": [2]},
        "backends.nvml": {ROOT: [3], "backends": [1], "backends.nvml.fields": [2]},
        "backends.nvml.fields": {"logs": [1]},
        "cli": {ROOT: [1, 2], "version": [2]},
        "monitor": {"backends.nvml": [5], "cli": [3]},
        "version": {},
    }
