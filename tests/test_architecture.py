"""The code's shape, checked: layers without cycles, small modules, comments that say why.

The import graph is read from the source (every ``import``, at module level or inside a
function: a lazy import still ties the two modules together), so a cycle or an upward import
fails here before it confuses a reader.
"""
import ast
import re
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("solver", "models", "boltzmann")
#: what each package may import from the others: solver and models know nothing above them
ALLOWED = {"solver": set(), "models": set(), "boltzmann": {"solver", "models"}}
MAX_LINES = 600
#: words that narrate the project's history instead of explaining the code
HISTORY = re.compile(r"\b[Ss]ession \d|\b[Ii]ssue (\d|#)|DESIGN §|\(was \d|\(was [a-z]"
                     r"|\b20\d\d-\d\d-\d\d\b")


def _modules():
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), path


def _imports(name: str, path: Path):
    """Fully qualified names of the project modules ``path`` imports."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            yield target
            for alias in node.names:  # "from pkg import module"
                yield f"{target}.{alias.name}"


@pytest.fixture(scope="module")
def graph():
    modules = dict(_modules())
    g = nx.DiGraph()
    g.add_nodes_from(modules)
    for name, path in modules.items():
        for target in _imports(name, path):
            if target in modules and target != name:
                g.add_edge(name, target)
    return g


def test_no_import_cycle(graph):
    # a package's __init__ re-exports its submodules, which import siblings through it: count
    # the edges between modules, and from a package only to modules outside it
    g = nx.DiGraph((a, b) for a, b in graph.edges
                   if not b.startswith(a + ".") and not a.startswith(b + "."))
    cycles = list(nx.simple_cycles(g))
    assert cycles == [], f"import cycles: {cycles[:5]}"


def test_layers(graph):
    bad = [(a, b) for a, b in graph.edges
           if a.split(".")[0] != b.split(".")[0]
           and b.split(".")[0] not in ALLOWED[a.split(".")[0]]]
    assert bad == [], f"imports against the layering (solver, models < boltzmann): {bad}"


def test_modules_are_small():
    big = {str(p.relative_to(REPO)): n for _, p in _modules()
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}, f"modules over {MAX_LINES} lines: {big}"


def test_comments_say_why_not_when():
    hits = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for _, p in _modules()
            for i, line in enumerate(p.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert hits == [], "history in product code:\n" + "\n".join(hits[:20])


def test_the_checks_can_fail(tmp_path):
    """The pattern and the cycle finder catch what they are meant to catch."""
    assert HISTORY.search("# measured in session 3 (was 2.2 s)")
    assert HISTORY.search("see DESIGN §7") and HISTORY.search("done on 2026-11-30")
    assert not HISTORY.search("the step was rejected; issue a warning")
    g = nx.DiGraph([("a", "b"), ("b", "a")])
    assert list(nx.simple_cycles(g))
