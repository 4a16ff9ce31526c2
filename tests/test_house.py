"""The house rules of docs/architecture.md, read off the code's own imports.

Each room may import only the rooms below it (the dashboard's rooms too); nothing imports
the command line but the command line; the spool's private modules are reached only
through its public face, the store's source objects only from the lake, the producer's
integrations only through their faces; and no chain of
module-level imports comes back to where it started. The tests keep one rule of their own:
no test module imports another.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("emitters", "sinks", "dashboard", "aggregator")
# What each top-level package may import of ours (at any level of a module).
ALLOWED = {
    "emitters": {"emitters"},
    "sinks": {"emitters", "sinks"},
    "dashboard": {"emitters", "sinks", "dashboard"},
    "aggregator": {"emitters", "sinks", "dashboard", "aggregator"},
}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = modules()


def imports(path: Path, *, top_level_only: bool) -> Iterator[str]:
    """The modules of ours that a file imports (names resolved to modules where they are)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.If) and top_level_only:  # `if TYPE_CHECKING:`: no run-time edge
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                yield child if child in MODULES else node.module


def test_each_package_imports_only_the_packages_below_it() -> None:
    upward = [f"{name} imports {target}" for name, path in MODULES.items()
              for target in imports(path, top_level_only=False)
              if target.split(".")[0] not in ALLOWED[name.split(".")[0]]]
    assert upward == []


def test_only_the_command_line_imports_the_command_line() -> None:
    found = [f"{name} imports {target}" for name, path in MODULES.items()
             for target in imports(path, top_level_only=False)
             if target.startswith("aggregator.cli")
             and not name.startswith(("aggregator.cli", "aggregator.__main__"))]
    assert found == []


def test_the_spools_private_modules_are_reached_through_its_face() -> None:
    found = [f"{name} imports {target}" for name, path in MODULES.items()
             for target in imports(path, top_level_only=False)
             if target.startswith("aggregator.spool._") and not name.startswith("aggregator.spool")]
    assert found == []


# The rooms of dashboard/, top to bottom (docs/architecture.md): each imports only itself
# and the rooms below it.
DASHBOARD_ROOMS = ("web", "cli", "raystate", "questions", "lake")


def dashboard_room(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "dashboard" and len(parts) > 1 else None


def test_every_dashboard_module_lives_in_a_room() -> None:
    homeless = [name for name in MODULES if name.startswith("dashboard.")
                and dashboard_room(name) not in DASHBOARD_ROOMS]
    assert homeless == []


def test_the_dashboards_rooms_import_only_downward() -> None:
    upward = []
    for name, path in MODULES.items():
        room = dashboard_room(name)
        if room not in DASHBOARD_ROOMS:
            continue
        below = DASHBOARD_ROOMS[DASHBOARD_ROOMS.index(room):]
        upward += [f"{name} imports {target}" for target in imports(path, top_level_only=False)
                   if target.startswith("dashboard.") and dashboard_room(target) not in below]
    assert upward == []


def test_only_the_lake_reaches_a_source_objects_private_module() -> None:
    found = [f"{name} imports {target}" for name, path in MODULES.items()
             for target in imports(path, top_level_only=False)
             if target.startswith("dashboard.lake.sources._")
             and not name.startswith("dashboard.lake.")]
    assert found == []


# The integrations' public faces (emitters/torch.py, ...): the core's only way into the room.
INTEGRATION_FACES = ("emitters.torch", "emitters.ray", "emitters.otel", "emitters.queueing")
# The one helper of the room that the agent shares: the span row of its OTLP route.
SHARED_WITH_THE_AGENT = "emitters.integrations.otel_rows"


def test_the_core_of_emitters_reaches_its_integrations_only_through_their_faces() -> None:
    found = [f"{name} imports {target}" for name, path in MODULES.items()
             for target in imports(path, top_level_only=False)
             if target.startswith("emitters.integrations")
             and not name.startswith("emitters.integrations") and name not in INTEGRATION_FACES
             and not (target == SHARED_WITH_THE_AGENT and name.startswith("aggregator."))]
    assert found == []


def test_no_import_circle() -> None:
    graph = {name: {t for t in imports(path, top_level_only=True) if t in MODULES and t != name}
             for name, path in MODULES.items()}
    # A package's __init__ importing its own modules is how a face works, not a circle.
    for name in graph:
        graph[name] = {t for t in graph[name] if not (MODULES[name].name == "__init__.py"
                                                        and t.startswith(name + "."))}
    circles = []
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                circles.append(" -> ".join([*trail[trail.index(target):], target]))
            elif target not in state:
                visit(target, [*trail, target])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert circles == []


@pytest.mark.parametrize("package", PACKAGES)
def test_every_folder_of_code_is_a_package(package: str) -> None:
    for folder in [p for p in (REPO / package).rglob("*") if p.is_dir()
                   and any(p.glob("*.py"))]:
        assert (folder / "__init__.py").exists(), folder


def test_no_module_waits_with_asyncio_wait_for() -> None:
    """On Python 3.11, asyncio.wait_for can swallow a cancellation that arrives as its
    inner await finishes (a second Ctrl-C then waited out the whole drain); the code
    bounds its waits with `async with asyncio.timeout(...)`, which does not."""
    users = [name for name, path in MODULES.items()
             if any(isinstance(node, ast.Attribute) and node.attr == "wait_for"
                    and isinstance(node.value, ast.Name) and node.value.id == "asyncio"
                    for node in ast.walk(ast.parse(path.read_text())))]
    assert users == []


def test_the_sink_types_are_listed_once() -> None:
    """sinks/registry.py is the one list of sink types: nothing else reaches a type's
    module, so a new type is one module and one line there."""
    reaching = {name for name, path in MODULES.items()
                for target in imports(path, top_level_only=False)
                if target.endswith(".sink_type") and target != "sinks.sink_type"}
    assert reaching == {"sinks.registry"}


def test_every_logger_is_named_under_evagg() -> None:
    """One logging setting on `evagg` reaches every line (docs/configuration.md): a logger
    named after its module (`sinks.parquet.sink`) would escape it. The one exception is
    where the log is set up: it quiets libraries' own loggers (QUIET_LIBRARIES)."""
    from aggregator.log_format import QUIET_LIBRARIES

    strays = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "getLogger"):
                first = node.args[0] if node.args else None
                quieted = (name == "aggregator.log_format" and isinstance(first, ast.Name)
                           and QUIET_LIBRARIES)
                if not quieted and not (
                        isinstance(first, ast.Constant) and isinstance(first.value, str)
                        and (first.value == "evagg" or first.value.startswith("evagg."))):
                    strays.append(f"{name}:{node.lineno}")
    assert strays == []


def test_docs_architecture_names_every_module() -> None:
    """docs/architecture.md's tables are how a newcomer finds a module by its job: each
    module is named there (by its file name in backticks, or by its path)."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    unnamed = [str(path.relative_to(REPO)) for path in MODULES.values()
               if path.name != "__init__.py" and f"`{path.name}`" not in doc
               and str(path.relative_to(REPO)) not in doc]
    assert unnamed == [], "name these in docs/architecture.md: " + ", ".join(unnamed)


def test_modules_named_test_are_imported_by_no_other() -> None:
    """A helper two test modules share lives in a named helper module beside them
    (tests/agentproc.py, tests/sinks/parquet/records.py, ...) or in a conftest.py, where
    the next test finds it: one test module importing another runs that module's imports
    and setup too, and ties a change to one module's tests to the other's."""
    found = set()
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            found |= {f"{path.relative_to(REPO)} imports {target}" for target in targets
                      if target.split(".")[0] == "tests"
                      and target.split(".")[-1].startswith("test_")}
    assert sorted(found) == []
