"""The shape of the package: the pure core imports no adapter, no two modules
import each other round a cycle (not even from inside a function), and a
module that grows past what one reads in a sitting is pointed out (a warning:
complexity, which ruff's C90 rule checks, is what fails; a module splits where
its concepts part, not at a line count)."""

import ast
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "prism_debug"
# graph, variability, engine, cost model, faults, scenarios, the flight-recorder format, and
# the small pieces they share: pure Python and numpy
CORE = ["prism_debug.cost", "prism_debug.graph", "prism_debug.engine", "prism_debug.faults",
        "prism_debug.scenario", "prism_debug.checked", "prism_debug.example",
        "prism_debug.errors", "prism_debug.agent.config", "prism_debug.backend.tracker",
        "prism_debug.backend.hooks", "prism_debug.backend.fr_dump_format",
        "prism_debug.snapshot.store", "prism_debug.reload", "prism_debug.variability",
        "prism_debug.predict", "prism_debug.incident"]
FORBIDDEN = {"torch", "zmq", "pycriu", "click"}
MAX_LINES = 800


def test_core_modules_import_no_adapters():
    code = (f"import json, sys\nfor m in {CORE!r}: __import__(m)\n"
            "print(json.dumps(sorted(m for m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = {name.split(".")[0] for name in json.loads(out.stdout)}
    assert loaded & FORBIDDEN == set()


# what the commands' start leaves out: every command imports the CLI module,
# every run the API, and these would add a fifth of a second to each start
# (the commands that need them load them)
NOT_AT_START = {
    "prism_debug.cli": {"numpy", "prism_debug.variability", "prism_debug.scenario",
                        "prism_debug.workflows.incident", "prism_debug.workflows.scenario_run"},
    "prism_debug.api": {"prism_debug.scenario", "prism_debug.workflows.incident",
                        "prism_debug.workflows.scenario_run"},
}


def test_the_commands_start_without_what_only_some_of_them_use():
    for module, left_out in NOT_AT_START.items():
        code = f"import json, sys, {module}\nprint(json.dumps(sorted(sys.modules)))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True)
        assert set(json.loads(out.stdout)) & left_out == set(), module


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package's modules ``path`` imports, wherever in it the import is."""
    found = set()
    # the package relative imports start from
    package = module_name(path) if path.name == "__init__.py" \
        else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    graph = {name: imports_of(path, modules) - {name} for name, path in paths.items()}
    # importing a module runs its packages' __init__ first: a package's
    # __init__ is not a cycle with the modules it re-exports
    return {name: {m for m in deps if not name.startswith(m + ".")}
            for name, deps in graph.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_imports_in_one_direction():
    graph = import_graph()
    assert "prism_debug.controller.launch" in graph["prism_debug.api"]  # the graph sees imports
    assert cycles(graph) == []


def test_a_cycle_would_be_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_a_module_too_long_to_read_in_a_sitting_is_pointed_out():
    long = {module_name(p): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    for name, lines in sorted(long.items()):
        warnings.warn(f"{name} has {lines} lines (over {MAX_LINES}): split it where its "
                      "concepts part", stacklevel=1)


#: the documentation page whose first code block lists the layout
LAYOUT_PAGE = ROOT / "docs" / "development" / "layout.md"


def layers_in_layout_page() -> list[str]:
    """The layout page's list: prism_debug's folders and modules, top down."""
    text = LAYOUT_PAGE.read_text()
    block = text[text.index("# Layout"):].split("```")[1]
    layers = []
    for line in block.splitlines():
        name = line[2:].split(" ", 1)[0] if line.startswith("  ") and line[2] != " " else ""
        if name.endswith("/"):
            layers.append(name[:-1])
        elif name.endswith(".py"):
            layers.append(name[:-3])
    return layers


def test_every_import_points_up_the_documented_layout():
    layers = layers_in_layout_page()
    graph = import_graph()
    units = {name.split(".")[1] for name in graph if name != "prism_debug"}
    assert sorted(layers) == sorted(units)  # the list names every folder and module
    upward = sorted(
        f"{name} imports {dep}"
        for name, deps in graph.items() if name != "prism_debug"
        for dep in deps if dep != "prism_debug"
        if layers.index(dep.split(".")[1]) > layers.index(name.split(".")[1]))
    assert upward == []


def folder_entries_in_layout_page() -> dict[str, str]:
    """Each folder's entry on the layout page (its name, then what it holds,
    continued on the indented lines below it)."""
    text = LAYOUT_PAGE.read_text()
    block = text[text.index("# Layout"):].split("```")[1]
    entries: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        if line.startswith("  ") and line[2] != " ":
            name, _, rest = line[2:].partition(" ")
            current = name[:-1] if name.endswith("/") else None
            if current is not None:
                entries[current] = rest
        elif line.startswith("    ") and current is not None:
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


def unnamed_modules(entries: dict[str, str]) -> list[str]:
    """The package's modules that their folder's entry does not name."""
    return sorted(
        f"{folder.name}/{module.name}"
        for folder in PACKAGE.iterdir() if (folder / "__init__.py").is_file()
        for module in folder.glob("*.py") if module.stem not in ("__init__", "__main__")
        if not re.search(rf"(?<![\w/]){re.escape(module.stem)}(?!\w)",
                         entries.get(folder.name, "")))


def test_the_layout_page_names_every_module_of_every_folder():
    assert unnamed_modules(folder_entries_in_layout_page()) == []


def test_a_module_the_layout_page_leaves_out_would_be_found():
    entries = folder_entries_in_layout_page()
    entries["bus"] = entries["bus"].replace("socket_dir", "")
    assert unnamed_modules(entries) == ["bus/socket_dir.py"]
