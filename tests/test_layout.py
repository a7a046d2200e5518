"""The layout's rules, read off the source: dependencies point one way (approval side -> journal, never
back), pure modules stay pure, and no import hides inside a function to dodge a loop."""

import ast
from pathlib import Path

from radon.complexity import cc_visit

ROOT = Path(__file__).resolve().parent.parent
APPS = ("journal", "approver")
# No ORM, no clock, no Django at all: directly or through any project module they import.
PURE = (
    "approver.planning",
    "approver.policy",
    "approver.signing",
    "approver.execution",
    "approver.answers",
    "approver.wording",
    "journal.record.canonical",
    "journal.record.chain",
    "journal.undo.declarations",
    "journal.undo.bindings",
    "journal.undo.dependencies",
    "journal.undo.outcomes",
    "journal.ports",
    "journal.errors",
    "journal.record.bundle",
    "journal.undo.recovery",
    "journal.record.journaling",
    "journal.undo.recipes",
    "journal.undo.recipe_text",
    "journal.undo.recipe_chains",
    "journal.undo.fields",
    "journal.tally",
    "journal.undo.database.reading",
    "journal.undo.database.postgres",
    "journal.undo.database.sqlite",
    "journal.undo.database.judging",
)
# Imports inside functions that are there for another reason than a loop: Django's app loading (models
# are ready only in `ready`), and the demo, which configures Django before it may import any model.
FUNCTION_IMPORTS_ALLOWED = {("approver.apps", "ready"), ("journal.apps", "ready"), *(
    ("approver.demo", name) for name in (
    "setup_django", "ensure_users", "ensure_tool_servers", "ensure_official_servers", "ensure_agent",
    "ensure_policy", "replay_globex", "replay_cleanup",
    "wait_for_worker")), ("approver.demo_database", "ensure_customers")}
MAX_LINES = 450
MAX_COMPLEXITY = 20  # radon's rank C at most: a function past it has grown a ladder of cases to lift out


def modules() -> dict[str, Path]:
    found = {}
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(name: str, path: Path, *, top_level_only: bool) -> set[str]:
    """The modules `name` imports (absolute names; `from x import y` counts as x and x.y)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = tree.body if top_level_only else ast.walk(tree)
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_the_journal_imports_nothing_from_the_approval_side():
    offending = {
        name: sorted(n for n in imported(name, path, top_level_only=False) if n.split(".")[0] == "approver")
        for name, path in modules().items()
        if name.split(".")[0] == "journal"
    }
    assert {name: found for name, found in offending.items() if found} == {}


def test_the_services_and_the_door_to_tool_servers_sit_below_the_recorder():
    """`journal.upstream` (the one client of tool servers) knows nothing above it; the services know the
    client, never the Recorder's server (`journal.mcp`), which calls them."""
    below = {"journal.services": ("journal.mcp", "approver"),
             "journal.upstream": ("journal.mcp", "journal.services", "journal.models", "approver")}
    offending = {}
    for name, path in modules().items():
        for layer, above in below.items():
            if name == layer or name.startswith(f"{layer}."):
                found = sorted(n for n in imported(name, path, top_level_only=False)
                               if any(n == a or n.startswith(f"{a}.") for a in above))
                if found:
                    offending[name] = found
    assert offending == {}


def test_pure_modules_import_no_django_directly_or_through_the_project():
    found = modules()
    graph = {name: imported(name, path, top_level_only=True) for name, path in found.items()}
    for start in PURE:
        seen, stack, django = set(), [start], []
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            for target in graph.get(current, ()):
                if target.split(".")[0] == "django":
                    django.append(f"{current} imports {target}")
                elif target in found:
                    stack.append(target)
        assert not django, f"{start} is not pure: {django}"


def test_no_function_level_import_dodges_a_loop():
    hidden = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and (name, node.name) not in FUNCTION_IMPORTS_ALLOWED
            ):
                hidden += [
                    f"{name}.{node.name}"
                    for sub in ast.walk(node)
                    if isinstance(sub, ast.Import | ast.ImportFrom)
                ]
    assert hidden == []


def test_no_module_of_the_app_grows_past_one_concept():
    long = {
        name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_no_function_of_the_apps_grows_past_a_ladder_of_twenty_cases():
    complex_ = {f"{name}.{block.fullname}": block.complexity for name, path in modules().items()
                for block in cc_visit(path.read_text()) if block.complexity > MAX_COMPLEXITY}
    assert complex_ == {}
