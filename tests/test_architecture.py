"""The package's shape: imports point down the layers only, and no module cycle exists.

The graph is read from the source with `ast`, so every import counts: module level,
inside functions, and under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import groupbuy

PACKAGE_DIR = Path(groupbuy.__file__).resolve().parent

# Lower numbers sit lower: a module may import its own layer's modules or lower ones.
LAYERS: list[tuple[str, int]] = [
    ("groupbuy.cli", 6),
    ("groupbuy.api", 5),
    ("groupbuy.console", 5),  # the operators' pages, mounted by the API app
    ("groupbuy.services", 4),
    ("groupbuy.migrations", 4),  # the schema of every model, below the composition root
    ("groupbuy.ops", 3),
    ("groupbuy.webhooks", 3),  # the feed pushed: reads storage's events, below services
    ("groupbuy.locks", 2),
    ("groupbuy.redpacket", 2),
    ("groupbuy.storage", 1),
    ("groupbuy.settings", 0),
    ("groupbuy.errors", 0),
    ("groupbuy.metrics", 0),
    ("groupbuy", 0),
]
# The two engines are independent of each other.
ENGINES = ("groupbuy.locks", "groupbuy.redpacket")
# Only the HTTP layer (and the command line that serves it) may know Starlette or uvicorn.
HTTP_LIBRARIES = ("starlette", "uvicorn")
# Only production code ships in the wheel: the package imports none of the test launchers,
# the browser, the doc renderers or the benchmarks.
NOT_IN_THE_WHEEL = ("selenium", "tests", "scripts", "benchmarks")
# fakeredis and lupa are test dependencies: one adapter imports them, and it is imported only
# from inside the functions that build the in-process fallback, when that is asked for.
FAKE_LIBRARIES = ("fakeredis", "lupa")
FAKE_ADAPTER = "groupbuy.storage.fake_adapter"


def module_name(path: Path) -> str:
    """`groupbuy/api/app.py` -> `groupbuy.api.app`; a package's __init__ is the package."""
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    return {module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def imported_names(
    path: Path, name: str, known: set[str], module_level: bool = False
) -> Iterator[str]:
    """Every module `path` imports (any depth in the file, or with `module_level` only those
    imported when the module is, not inside a function), absolute names resolved."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in _module_level_nodes(tree) if module_level else ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from package import module` imports the module; otherwise the package.
                candidate = f"{base}.{alias.name}"
                yield candidate if candidate in known else base


def _module_level_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """The nodes run when the module is imported: all but the bodies of functions."""
    for node in ast.iter_child_nodes(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield node
            yield from _module_level_nodes(node)


def graph() -> dict[str, set[str]]:
    """groupbuy module -> the groupbuy modules it imports."""
    found = modules()
    known = set(found)
    edges: dict[str, set[str]] = {}
    for name, path in found.items():
        targets = {t for t in imported_names(path, name, known) if t in known and t != name}
        edges[name] = targets
    return edges


def layer_of(name: str) -> tuple[str, int]:
    """The layer a module belongs to: the longest matching prefix in LAYERS."""
    for prefix, rank in LAYERS:
        if name == prefix or name.startswith(prefix + "."):
            return prefix, rank
    raise AssertionError(f"{name} is in no layer; add it to LAYERS")


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_every_module_has_a_layer() -> None:
    for name in modules():
        layer_of(name)


def test_no_module_imports_a_higher_layer() -> None:
    upward = []
    for source, targets in graph().items():
        source_layer, source_rank = layer_of(source)
        for target in sorted(targets):
            target_layer, target_rank = layer_of(target)
            if target_rank > source_rank:
                upward.append(f"{source} ({source_layer}) imports {target} ({target_layer})")
    assert upward == []


def test_the_engines_do_not_import_each_other() -> None:
    crossing = [
        f"{source} imports {target}"
        for source, targets in graph().items()
        for target in targets
        for engine in ENGINES
        if layer_of(source)[0] == engine
        and layer_of(target)[0] in ENGINES
        and layer_of(target)[0] != engine
    ]
    assert crossing == []


def test_there_is_no_import_cycle() -> None:
    assert find_cycle(graph()) is None


def test_the_grab_path_reaches_recovery_only_through_its_hook() -> None:
    """The hot path's module imports none of the red-packet parts that bring a packet back,
    send or sweep: recovery is handed in (RedPackets.build) behind one hook."""
    others = {f"groupbuy.redpacket.{part}" for part in ("recovery", "sending", "sweeps", "engine")}
    assert graph()["groupbuy.redpacket.grab"] & others == set()


def test_only_the_api_knows_http() -> None:
    found = modules()
    known = set(found)
    leaks = []
    for name, path in found.items():
        if layer_of(name)[0] in ("groupbuy.api", "groupbuy.console", "groupbuy.cli"):
            continue
        for target in imported_names(path, name, known):
            if target.split(".")[0] in HTTP_LIBRARIES:
                leaks.append(f"{name} imports {target}")
    assert leaks == []


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"b"}, "b": {"b2"}, "b2": {"b"}}, ["b", "b2", "b"]),
    ],
)
def test_the_cycle_finder_finds_cycles(
    edges: dict[str, set[str]], expected: list[str] | None
) -> None:
    assert find_cycle(edges) == expected


def test_the_graph_sees_type_checking_and_function_imports(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from groupbuy.api.app import create_app\n"
        "def late():\n    import groupbuy.services\n"
        "from groupbuy.ops import jobs\n",
        encoding="utf-8",
    )
    known = set(modules())
    names = set(imported_names(source, "groupbuy.probe", known))
    assert {"groupbuy.api.app", "groupbuy.services", "groupbuy.ops.jobs"} <= names


def test_the_package_imports_no_test_tool_and_fakeredis_only_in_its_adapter() -> None:
    found = modules()
    known = set(found)
    leaks = []
    for name, path in found.items():
        for target in imported_names(path, name, known):
            top = target.split(".")[0]
            if top in NOT_IN_THE_WHEEL or (top in FAKE_LIBRARIES and name != FAKE_ADAPTER):
                leaks.append(f"{name} imports {target}")
        eager = set(imported_names(path, name, known, module_level=True))
        if FAKE_ADAPTER in eager and name != FAKE_ADAPTER:
            leaks.append(f"{name} imports {FAKE_ADAPTER} when it is imported")
    assert leaks == []


def test_the_import_finder_tells_module_level_from_function_imports(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "import selenium\n"
        "try:\n    import lupa\nexcept ImportError:\n    pass\n"
        "def late():\n    from groupbuy.storage import fake_adapter\n"
        "class Late:\n    async def later(self):\n        import fakeredis\n",
        encoding="utf-8",
    )
    known = set(modules())
    eager = set(imported_names(source, "groupbuy.probe", known, module_level=True))
    every = set(imported_names(source, "groupbuy.probe", known))
    assert eager == {"selenium", "lupa"}
    assert every == eager | {FAKE_ADAPTER, "fakeredis"}


def test_the_app_loads_no_test_tool() -> None:
    """Importing the service (the app, the command line, the services) loads neither
    fakeredis nor lupa, selenium, the tests, the scripts nor the benchmarks."""
    unwanted = {*FAKE_LIBRARIES, *NOT_IN_THE_WHEEL}
    probe = (
        "import sys, groupbuy.api.app, groupbuy.cli, groupbuy.services; "
        f"loaded = sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(unwanted)!r})); "
        "print(','.join(loaded))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == ""


def test_the_worker_runs_without_the_http_stack() -> None:
    """`groupbuy worker` builds and runs the services without importing Starlette or uvicorn."""
    probe = (
        "import sys, groupbuy.cli, groupbuy.services; "
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'starlette', 'uvicorn'}); "
        "print(','.join(loaded))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == ""


def test_tests_share_helpers_through_tests_support_only() -> None:
    """No test imports another test module or conftest; only the benchmark's own tests
    (test_benchmark_*.py) import the benchmark."""
    tests_dir = Path(__file__).resolve().parent
    offenders = []
    for path in sorted(tests_dir.rglob("*.py")):
        name = ".".join(path.relative_to(tests_dir.parent).with_suffix("").parts)
        for target in imported_names(path, name, set()):
            leaf = target.split(".")[-1]
            if target.startswith("tests.") and (leaf.startswith("test_") or leaf == "conftest"):
                offenders.append(f"{name} imports {target}")
            if target.split(".")[0] == "benchmarks" and not path.name.startswith("test_benchmark_"):
                offenders.append(f"{name} imports {target}")
    assert offenders == []


# The layers that call scripts through their wrappers: none of them may pick a key out of a
# key list by position (storage builds the key groups; its generic lists, such as the keys
# of one pipelined command, are not script key groups).
DOMAIN_LAYERS = ("groupbuy.locks", "groupbuy.redpacket", "groupbuy.ops", "groupbuy.api")
WRAPPERS = ("groupbuy.locks.scripts", "groupbuy.redpacket.specs")
# The engines' size bounds: a reader takes in one module, or one class, at a sitting.
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 300


def _named(node: ast.expr) -> str:
    """The name an expression ends in: `keys`, `self._keys`, `k.team_keys(...)`."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _by_position(index: ast.expr) -> bool:
    if isinstance(index, ast.Slice):
        return any(isinstance(b, ast.Constant) for b in (index.lower, index.upper))
    if isinstance(index, ast.UnaryOp):  # keys[-1]
        index = index.operand
    return isinstance(index, ast.Constant) and isinstance(index.value, int)


def test_no_key_list_is_indexed_by_position_outside_the_wrappers() -> None:
    found = []
    for name, path in modules().items():
        if layer_of(name)[0] not in DOMAIN_LAYERS or name in WRAPPERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Subscript) or not _by_position(node.slice):
                continue
            if _named(node.value).lstrip("_").endswith("keys"):
                found.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert found == []


def test_the_position_finder_sees_key_lists() -> None:
    source = "a = keys[3]\nb = self._keys[:2]\nc = k.team_keys('a')[-1]\nd = rows[0]\n"
    hits = [
        ast.unparse(n)
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Subscript)
        and _by_position(n.slice)
        and _named(n.value).lstrip("_").endswith("keys")
    ]
    assert hits == ["keys[3]", "self._keys[:2]", "k.team_keys('a')[-1]"]


@pytest.mark.parametrize("engine", ENGINES)
def test_engine_modules_and_classes_stay_small(engine: str) -> None:
    too_big = []
    for name, path in modules().items():
        if layer_of(name)[0] != engine:
            continue
        source = path.read_text(encoding="utf-8")
        if (lines := len(source.splitlines())) > MAX_MODULE_LINES:
            too_big.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ClassDef) or node.end_lineno is None:
                continue
            if (size := node.end_lineno - node.lineno + 1) > MAX_CLASS_LINES:
                too_big.append(f"{name}.{node.name}: {size} lines")
    assert too_big == []


# The seat service and the modules of its operations: the team engine's hot path.
SEAT_PATH = ("seats", "lock", "unlock", "join", "confirm")


@pytest.mark.parametrize("module", SEAT_PATH)
def test_the_seat_path_reaches_recovery_only_through_its_hook(module: str) -> None:
    """The hot path's modules import none of the team parts that bring a team back, sweep
    or administer: recovery is handed in (TeamEngine.build) behind one hook."""
    others = {f"groupbuy.locks.{part}" for part in ("recovery", "sweeps", "activities", "engine")}
    assert graph()[f"groupbuy.locks.{module}"] & others == set()
