"""Where code may import from: the agent and the wire package stay installable with the
agent's own small dependencies, and nothing outside the agent reaches into it (shared
things live in cmdare.wire)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"wire": "cmdare.wire", "agent": "cmdare.agent", "collector": "cmdare.collector", "analytics": "cmdare.analytics"}
# the server extra: what the agent must never need
SERVER = ("duckdb", "pyarrow", "numpy", "click", "statsmodels", "scipy", "pandas")


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module imported, at the top level of the file) for every import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    top = set(map(id, tree.body))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, id(node) in top))
    return out


def _files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("folder", ["wire", "collector", "analytics"])
def test_nothing_outside_the_agent_imports_the_agent(folder: str) -> None:
    bad = [
        f"{p.relative_to(ROOT)}: {m}"
        for p in _files(folder)
        for m, _ in _imports(p)
        if m == "cmdare.agent" or m.startswith("cmdare.agent.")
    ]
    assert bad == []


@pytest.mark.parametrize("folder", ["wire", "agent"])
def test_the_agent_and_the_wire_package_never_import_the_server_side(folder: str) -> None:
    bad = []
    for p in _files(folder):
        for m, top in _imports(p):
            if m.startswith(("cmdare.collector", "cmdare.analytics")):
                bad.append(f"{p.relative_to(ROOT)}: {m}")
            if m.split(".")[0] in SERVER and top:  # a lazy import inside a function is allowed
                bad.append(f"{p.relative_to(ROOT)}: {m} at module level")
    assert bad == []


def test_the_agent_runs_without_the_server_extra(tmp_path: Path) -> None:
    """Every agent and wire module imports, and the agent samples and spools one round,
    with the server extra's packages made unimportable."""
    modules = sorted(
        {
            PACKAGES[p.relative_to(ROOT).parts[0]] + "".join(f".{x}" for x in p.relative_to(ROOT).with_suffix("").parts[1:])
            for folder in ("wire", "agent")
            for p in _files(folder)
            if p.name != "__init__.py" and "adapters" not in p.parts  # adapters import their framework
        }
    )
    code = f"""
import importlib, importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {SERVER!r}:
            raise ImportError('server package ' + name + ' imported by the agent')
sys.meta_path.insert(0, Block())
for m in {modules!r}:
    importlib.import_module(m)
from cmdare.agent.cli import main
sys.argv = ['cmdare-agent', '--spool-dir', {str(tmp_path)!r}, '--duration', '0.3', '--interval', '0.1s',
            '--set', 'sources.gpu.enabled=false']
sys.exit(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert any(tmp_path.glob("*.ndjson"))


def _relative_imports(path: Path) -> list[str]:
    """Modules a file imports, relative ones resolved against its package."""
    pkg = ".".join(["cmdare", *path.relative_to(ROOT).with_suffix("").parts[:-1]])
    tree = ast.parse(path.read_text(), str(path))
    out = [m for m, _ in _imports(path)]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = pkg.rsplit(".", node.level - 1)[0] if node.level > 1 else pkg
            out.append(f"{base}.{node.module}" if node.module else base)
    return out


# The collector's front end (collector/cli/: its commands, its one config, the composition root
# that wires ingest, the API and alerting, and the lake server's) is the only collector folder
# that may import the analytics side.
def test_the_collector_core_does_not_import_analytics() -> None:
    front = ROOT / "collector" / "cli"
    bad = [f"{p.relative_to(ROOT)} imports {m}" for p in (ROOT / "collector").rglob("*.py")
           if front not in p.parents for m in _relative_imports(p) if m.startswith("cmdare.analytics")]
    assert bad == []


def test_front_ends_are_thin_and_the_library_knows_no_front_end() -> None:
    lib = [*(ROOT / "analytics" / "api").glob("*.py"), *(ROOT / "analytics" / n for n in ("db.py", "queries.py", "codec.py"))]
    for p in lib:
        mods = _relative_imports(p)
        assert not any(m == "click" or m.startswith(("fastapi", "starlette", "cmdare.analytics.cli",
                                                      "cmdare.analytics.server.http")) for m in mods), p
    http = _relative_imports(ROOT / "analytics" / "server" / "http.py")
    assert "click" not in http and not any(m.startswith("cmdare.analytics.cli") for m in http)
    for p in (ROOT / "analytics" / "cli").glob("*.py"):  # small command modules
        assert len(p.read_text().splitlines()) <= 600, p


def test_no_module_of_the_server_side_over_600_lines() -> None:
    long = [f"{p.relative_to(ROOT)}: {n}" for folder in ("analytics", "collector") for p in _files(folder)
            if (n := len(p.read_text().splitlines())) > 600]
    assert long == []


def test_alerting_is_one_package_and_the_collector_holds_none_of_it() -> None:
    pkg = ROOT / "analytics" / "alerting"
    have = {p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py")}
    assert {"rulefmt.py", "evaluate.py", "state.py", "ruletest.py", "notify/__init__.py",
            "notify/http.py", "notify/kafka.py", "notify/log.py"} <= have
    assert not (ROOT / "collector" / "alerting.py").exists() and not (ROOT / "analytics" / "alerts.py").exists()
    # the rules on threads with their receivers (the schedule) are the server's: notify
    # imports the alert state, so a schedule inside alerting/ made the two packages a cycle
    assert (ROOT / "analytics" / "server" / "schedule.py").exists() and "schedule.py" not in have
    # the rule format and evaluation know nothing of delivery or threads
    for name in ("rulefmt.py", "evaluate.py"):
        mods = _relative_imports(pkg / name)
        assert not any(".notify" in m or ".schedule" in m or m == "threading" for m in mods), name


def test_one_home_for_opening_a_database_file() -> None:
    """duckdb.connect appears in collector/db.py only (and the in-memory empty database)."""
    bad = []
    for folder in ("analytics", "collector"):
        for p in _files(folder):
            text = p.read_text()
            if "duckdb.connect(" in text and p.relative_to(ROOT).as_posix() != "collector/db.py":
                lines = [x.strip() for x in text.splitlines() if "duckdb.connect(" in x]
                if not all(":memory:" in x for x in lines):
                    bad.append(f"{p.relative_to(ROOT)}: {lines}")
    assert bad == []


# -- the shape of the code: no cycles, no giant module or function ---------------------------

CODE = ("agent", "wire", "collector", "analytics", "dashboards")
# functions still over the limits below, each to be split (this list only shrinks; docs/testing.md)
LONG_FUNCTIONS: set[str] = set()


def _module_name(p: Path) -> str:
    parts = list(p.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["cmdare", *parts])


def _import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports (anywhere in the file, lazy imports too;
    ``from pkg import name`` counts as the submodule ``pkg.name`` where there is one)."""
    files = {_module_name(p): p for folder in CODE for p in _files(folder)}

    def owner(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, p in files.items():
        pkg = mod if p.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Import):
                deps |= {o for a in node.names if (o := owner(a.name))}
            elif isinstance(node, ast.ImportFrom):
                base = pkg
                for _ in range(max(node.level - 1, 0)):
                    base = base.rpartition(".")[0]
                full = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
                for a in node.names:
                    o = f"{full}.{a.name}" if f"{full}.{a.name}" in files else owner(full)
                    if o:
                        deps.add(o)
        graph[mod] = deps - {mod}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_among_the_projects_modules() -> None:
    assert _cycles(_import_graph()) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _package_of(mod: str) -> str:
    """The package (folder) a module is in; a package's ``__init__`` is in the package."""
    parts = mod.split(".")
    return mod if ROOT.joinpath(*parts[1:]).is_dir() else ".".join(parts[:-1])


def _package_graph(graph: dict[str, set[str]], package_of: Callable[[str], str] = _package_of
                   ) -> dict[str, set[str]]:
    """Package -> the packages its modules import (a module importing its parent package's
    modules counts: a parent importing a child's back is then a cycle)."""
    out: dict[str, set[str]] = {}
    for a, deps in graph.items():
        pa = package_of(a)
        out.setdefault(pa, set()).update(pb for b in deps if (pb := package_of(b)) != pa)
    return out


def test_no_package_imports_another_that_imports_it_back() -> None:
    """Counting imports inside functions: collector's core and analytics, the server and the
    pages, alerting and its receivers, the agent and its sources each import one way."""
    assert _cycles(_package_graph(_import_graph())) == []


def test_the_package_check_finds_two_packages_importing_each_other() -> None:
    graph = {"cmdare.collector.root": {"cmdare.analytics.server.service"},
             "cmdare.analytics.server.lakeserve": {"cmdare.collector.db"},
             "cmdare.collector.db": {"cmdare.wire.events"}}
    pkgs = _package_graph(graph, lambda m: m.rpartition(".")[0])
    assert _cycles(pkgs) == [["cmdare.analytics.server", "cmdare.collector"]]


# -- one-way layers (docs/extending.md, "Layers") ------------------------------------------
# wire (the format) <- store (schema, views, rollups, the database and the lake) <- ingest (the
# collector's core; the agent beside it) <- the analytics library <- the server (HTTP,
# tokens, throttle, pages, report) <- the front ends (CLIs, the collector's composition
# root and entry points).  A module imports its own layer and those below, never above;
# imports inside functions count.
STORE = {"cmdare.collector.db", "cmdare.collector.views", "cmdare.collector.rollup", "cmdare.collector.lake",
         "cmdare.collector.lakerollup", "cmdare.collector.lease", "cmdare.collector.ingest.storage"}
FRONT_ENDS = ("cmdare.collector.cli", "cmdare.analytics.cli")  # the packages of the two commands
LAYERS = ("wire", "store", "ingest", "analytics", "server", "front end")


def _layer(mod: str) -> int:
    parts = mod.split(".")
    if parts[1] == "wire":
        return 0
    if mod in STORE:
        return 1
    if mod.startswith(FRONT_ENDS):
        return 5
    if parts[1] in ("collector", "agent"):
        return 2
    if parts[1:3] == ["analytics", "server"] or parts[1] == "dashboards":
        return 4
    return 3


def _against_layers(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} ({LAYERS[_layer(a)]}) imports {b} ({LAYERS[_layer(b)]})"
                  for a, deps in graph.items() for b in deps if _layer(b) > _layer(a))


def test_imports_go_one_way_down_the_layers() -> None:
    assert _against_layers(_import_graph()) == []


def test_the_layer_check_finds_an_import_against_the_arrow() -> None:
    graph = {"cmdare.collector.db": {"cmdare.analytics.api.fleet"}, "cmdare.analytics.api.fleet": {"cmdare.collector.db"},
             "cmdare.analytics.detectors.gpu_idle": {"cmdare.analytics.server.http"},
             "cmdare.analytics.cli.findings": {"cmdare.analytics.server.http", "cmdare.wire.events"}}
    assert _against_layers(graph) == [
        "cmdare.analytics.detectors.gpu_idle (analytics) imports cmdare.analytics.server.http (server)",
        "cmdare.collector.db (store) imports cmdare.analytics.api.fleet (analytics)",
    ]


def test_every_folder_with_python_ships_in_the_wheel() -> None:
    """pyproject.toml lists the packages one by one (the folders map onto ``cmdare.*``): a
    folder missing there installs from a checkout (editable) but not from a wheel.  The
    GPU source, the typed API and the CLI's commands were missing once."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    have = {".".join(["cmdare", *p.parent.relative_to(ROOT).parts]) for folder in (*CODE,) for p in _files(folder)}
    assert have - listed == set()


def test_no_module_over_600_lines() -> None:
    long = [f"{p.relative_to(ROOT)}: {n}" for folder in CODE for p in _files(folder)
            if (n := len(p.read_text().splitlines())) > 600]
    assert long == []


def test_no_function_over_100_lines_or_15_parameters() -> None:
    found = set()
    for folder in CODE:
        for p in _files(folder):
            for node in ast.walk(ast.parse(p.read_text(), str(p))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = node.args
                    params = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
                    if node.end_lineno - node.lineno + 1 > 100 or params > 15:
                        found.add(f"{p.relative_to(ROOT)}:{node.name}")
    assert found - LONG_FUNCTIONS == set(), "new long functions"
    assert LONG_FUNCTIONS - found == set(), "split: take them off LONG_FUNCTIONS"


def test_every_equivalent_mutant_entry_names_a_line_that_is_there() -> None:
    """scripts/mutation-equivalent.toml matches lines by their code: an entry whose line was
    changed or removed marks nothing and must go (or be rewritten)."""
    import tomllib

    entries = tomllib.loads((ROOT / "scripts" / "mutation-equivalent.toml").read_text())["equivalent"]
    stale = []
    for e in entries:
        lines = {x.split("  # ")[0].strip() for x in (ROOT / e["file"]).read_text().splitlines()}
        if e["line"].split("  # ")[0].strip() not in lines or not e["operators"] or not e["why"]:
            stale.append(f"{e['file']}: {e['line'][:60]}")
    assert entries and stale == []
    assert not [p for folder in CODE for p in _files(folder) if "mutation-equivalent" in p.read_text()]


def _shadowing(init: Path) -> list[str]:
    """Names a package's ``__init__`` defines that are also its submodules' names."""
    return _shadowing_in(init, init.parent)


def _shadowing_in(init: Path, package: Path) -> list[str]:
    mods = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    mods |= {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    tree = ast.parse(init.read_text())
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    where = init.relative_to(ROOT) if ROOT in init.parents else init.name
    return sorted(f"{where}: {name}" for name in defined & mods)


def test_no_package_defines_a_name_its_submodule_has() -> None:
    """collector/cli/__init__.py defined the click command ``serve`` beside the module
    ``serve.py``: ``from cmdare.collector.cli import serve`` gave the command or the module
    depending on what had been imported before (three lake tests failed in one run only)."""
    inits = [p for folder in CODE for p in _files(folder) if p.name == "__init__.py"]
    assert [x for p in inits for x in _shadowing(p)] == []


def test_the_shadowing_check_finds_a_command_named_as_its_module(tmp_path: Path) -> None:
    pkg = ROOT / "collector" / "cli"
    fake = tmp_path / "__init__.py"
    fake.write_text("def serve():\n    pass\n")
    assert [x.split(": ")[1] for x in _shadowing_in(fake, pkg)] == ["serve"]
