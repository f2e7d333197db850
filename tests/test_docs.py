"""Docs that must stay true: every wire-format field and dead-letter reason documented,
every pluggable unit (source, detector, recommender) with its docs heading, its options and
a test file of its own, every console command in the README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cmdare.agent.sources import REGISTRY
from cmdare.analytics.detectors import DETECTORS
from cmdare.analytics.recommend import RECOMMENDERS
from cmdare.wire.events import DATA_FIELDS
from cmdare.wire.validation import RULES

ROOT = Path(__file__).resolve().parent.parent


def test_every_data_field_is_in_the_wire_format_doc() -> None:
    doc = (ROOT / "docs" / "wire-format.md").read_text()
    for type_, fields in DATA_FIELDS.items():
        assert f"### `{type_}`" in doc
        for name in fields:
            assert f"| `{name}` |" in doc, f"{type_}.{name} missing from docs/wire-format.md"


def test_every_source_and_option_is_documented() -> None:
    doc = (ROOT / "docs" / "sources.md").read_text()
    sample = (ROOT / "agent" / "packaging" / "agent.sample.toml").read_text()
    for name, cls in REGISTRY.items():
        assert f"## {name}" in doc and f"[sources.{name}]" in sample
        for opt in cls.OPTIONS:
            assert f"`{opt}`" in doc and f"{opt} =" in sample, f"sources.{name}.{opt} undocumented"


# registry, its docs page, the folder of its units' test files (test_<name>.py)
UNITS = [
    (REGISTRY, "docs/sources.md", "tests/agent"),
    (DETECTORS, "docs/detectors.md", "tests/analytics/detectors"),
    (RECOMMENDERS, "docs/recommendations.md", "tests/analytics/recommend"),
]


@pytest.mark.parametrize("registry, doc, tests", UNITS, ids=[u[0].kind for u in UNITS])
def test_every_unit_has_a_docs_heading_its_options_and_a_test_file(registry, doc, tests) -> None:
    text = (ROOT / doc).read_text()
    for name, cls in registry.items():
        assert re.search(rf"^## {name}( |$)", text, re.M), f"{registry.kind} {name}: no '## {name}' heading in {doc}"
        for opt in cls.OPTIONS:
            assert f"`{opt}`" in text, f"{registry.kind} {name}: option {opt} not in {doc}"
        assert (ROOT / tests / f"test_{name}.py").is_file(), f"{registry.kind} {name}: no {tests}/test_{name}.py"


def test_every_page_has_a_heading_and_a_test_that_opens_it() -> None:
    from cmdare.dashboards.pages import PAGES

    doc = (ROOT / "dashboards" / "README.md").read_text()
    tests = "".join(p.read_text() for p in (ROOT / "tests" / "dashboards").glob("test_*.py"))
    for name, page in PAGES.items():
        assert re.search(rf"^## {name}$", doc, re.M), f"page {name}: no '## {name}' heading in dashboards/README.md"
        opened = page.path.split("{")[0] if page.path else '"report"'
        assert opened in tests, f"page {name}: no test opens {opened}"


def test_every_dead_letter_reason_is_documented() -> None:
    doc = (ROOT / "docs" / "wire-format.md").read_text()
    for name in RULES:
        assert f"| `{name}` |" in doc, f"dead-letter rule {name} missing from docs/wire-format.md"


def test_readme_has_the_two_commands_and_ci_runs_the_second() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "scripts/demo" in readme and "scripts/test" in readme
    assert "exec scripts/test" in (ROOT / ".ci" / "run").read_text()
    for cmd in ("cmdare-agent --check", "cmdare-collector kafka", "cmdare-collector spool"):
        assert cmd in readme


def test_every_shipped_alert_rule_has_a_docs_heading_and_a_test() -> None:
    from cmdare.analytics.alerting import load_files

    doc = (ROOT / "docs" / "alerts.md").read_text()
    tests = (ROOT / "tests" / "analytics" / "alerting" / "test_default_rules.py").read_text()
    for g in load_files(["default"]):
        for r in g.rules:
            assert re.search(rf"^## {r.name}$", doc, re.M), f"rule {r.name}: no '## {r.name}' heading in docs/alerts.md"
            snake = re.sub(r"(?<!^)(?=[A-Z])", "_", r.name).lower()
            assert f"def test_{snake}(" in tests, f"rule {r.name}: no test_{snake} in test_default_rules.py"


def test_every_mutation_target_is_in_the_testing_doc_with_modules_and_tests_that_exist() -> None:
    """scripts/mutation's targets (the core modules whose bugs lose data or page people)
    each have a row in docs/testing.md's score table; their modules and tests exist."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("mutation_script", str(ROOT / "scripts" / "mutation"))
    spec = importlib.util.spec_from_loader("mutation_script", loader)
    assert spec is not None
    m = importlib.util.module_from_spec(spec)
    loader.exec_module(m)
    doc = (ROOT / "docs" / "testing.md").read_text()
    for name, (module, tests) in m.TARGETS.items():
        paths = [t for i, t in enumerate(tests) if not t.startswith("-") and not tests[i - 1].startswith("-")]
        assert (ROOT / module).is_file() and all((ROOT / t.split("::")[0]).is_file() for t in paths), name
        assert re.search(rf"^\| `{name}` \| `{re.escape(module)}` \|", doc, re.M), f"{name}: no row in docs/testing.md"


@pytest.mark.parametrize("registry, doc", [(DETECTORS, "docs/detectors.md"), (RECOMMENDERS, "docs/recommendations.md")],
                         ids=["detector", "recommender"])
def test_every_documented_default_is_the_units_default(registry, doc) -> None:
    """A user reads the default and the range of each option in the docs' option table:
    they must be the ones the unit uses (a bound loosened or tightened in code fails here)."""
    text = (ROOT / doc).read_text()
    for name, cls in registry.items():
        section = re.split(rf"^## {name}(?: .*)?$", text, flags=re.M)[1].split("\n## ")[0]
        assert "| option | default | range | meaning |" in section, f"{doc} {name}: no option table with a range"
        table = re.findall(r"^\| `(\w+)` \| ([^|]*?) \| ([^|]*?) \|", section, re.M)
        rows = {opt: default for opt, default, _ in table}
        ranges = {opt: rng for opt, _, rng in table}
        assert set(rows) == set(cls.OPTIONS), f"{doc} {name}: the table has {sorted(rows)}, the unit {sorted(cls.OPTIONS)}"
        for opt, o in cls.OPTIONS.items():
            assert ranges[opt].strip() == o.accepts(), (
                f"{doc} says {name}.{opt} accepts {ranges[opt].strip()!r}; the code accepts {o.accepts()!r}")
            shown = rows[opt].strip()
            if o.kind in ("duration", "size"):
                shown = shown.replace(" ", "").replace("min", "m")
            if not re.fullmatch(r"[\w.:, -]+", shown):
                continue  # prose ("(or a declaration)", "(none)"): no value to compare
            if o.kind == "list":
                shown = [x.strip() for x in shown.split(",")]
            elif o.kind in ("int", "float"):
                shown = shown.replace(",", "")
            assert o.parse(f"{name}.{opt}", shown) == o.parse(f"{name}.{opt}", o.default), (
                f"{doc} says {name}.{opt} defaults to {rows[opt].strip()!r}; the code has {o.default!r}")


def test_the_range_said_is_the_range_parsed() -> None:
    """Option.accepts() (the docs' range column, the refusal message) says what parse
    accepts: each bound itself accepted (unless open) and a step past it refused."""
    from cmdare.wire.plugin import ConfigError

    seen = 0
    for registry in (DETECTORS, RECOMMENDERS):
        for name, cls in registry.items():
            for opt, o in cls.OPTIONS.items():
                if o.kind not in ("int", "float"):
                    continue
                step = 1 if o.kind == "int" else 1e-9
                lo = 0 if o.kind == "int" and o.lo is None else o.lo
                key = f"{name}.{opt}"
                for bound, past, is_open in ((lo, -step, o.lo_open), (o.hi, step, False)):
                    if bound is None:
                        continue
                    seen += 1
                    assert f"{bound:g}" in o.accepts(), key
                    with pytest.raises(ConfigError, match=re.escape(key)):
                        o.parse(key, bound + past)
                    if is_open:
                        with pytest.raises(ConfigError):
                            o.parse(key, bound)
                    else:
                        assert o.parse(key, bound) == bound, key
    assert seen > 30


def test_the_bottlenecks_help_names_every_detector() -> None:
    from cmdare.analytics.cli import cli
    from cmdare.analytics.detectors import DETECTORS

    text = " ".join((cli.commands["bottlenecks"].help or "").split())
    assert [d for d in DETECTORS if d not in text] == []
    # the README's line for the command too (it listed 7 of 11; issue 67)
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("analyze bottlenecks --since 1d"):].split("\nanalyze ", 1)[0]
    assert [d for d in DETECTORS if d not in block] == []



def test_each_detector_declares_its_place_and_what_it_finds() -> None:
    """Issue 67: the detectors' order and the help's list of what they find were written
    by hand beside the registry. Each unit now declares its ORDER and FINDS; the registry's
    order and the help follow them (a new detector adds itself to both)."""
    from cmdare.analytics.cli import cli
    from cmdare.analytics.detectors import DETECTORS

    units = [DETECTORS.get(n) for n in DETECTORS]
    assert all(u.FINDS and u.ORDER < 1000 for u in units), [u.name for u in units if not u.FINDS]
    assert [u.ORDER for u in units] == sorted(u.ORDER for u in units)
    text = " ".join((cli.commands["bottlenecks"].help or "").split())
    spots = [text.index(u.FINDS) for u in units]
    assert spots == sorted(spots) and "{" not in text


def _documented_routes(text: str) -> set[str]:
    """Every ``METHOD /path`` docs/service.md names, its ``{a,b}`` alternations expanded
    (``{job}``, a parameter, stays a parameter)."""
    out = set()
    for m in re.finditer(r"\b(GET|POST|PUT|DELETE) (/[A-Za-z0-9_./{},-]*)", text):
        paths = [m.group(2).rstrip(".,")]
        while any("," in part for p in paths for part in re.findall(r"\{[^}]*\}", p)):
            nxt = []
            for p in paths:
                alt = next((a for a in re.findall(r"\{[^}]*\}", p) if "," in a), None)
                nxt += [p.replace(alt, x, 1) for x in alt[1:-1].split(",")] if alt else [p]
            paths = nxt
        out |= {f"{m.group(1)} {re.sub(r'{[^}]*}', '{}', p)}" for p in paths}
    return out


def test_every_api_route_is_in_the_service_doc(tmp_path: Path) -> None:
    """docs/service.md omitted /api/v1/runs, /api/v1/goodput and two prediction routes
    (issue 67): every route the API serves is in its table, method and path."""
    from cmdare.analytics.db import Database
    from cmdare.analytics.server.http import create_app

    doc = _documented_routes((ROOT / "docs" / "service.md").read_text())
    served = set()
    for r in create_app(Database(tmp_path / "x.duckdb")).routes:
        path = getattr(r, "path", "")
        if not path.startswith("/api/"):
            continue
        served |= {f"{m} {re.sub(r'{[^}]*}', '{}', path)}" for m in (getattr(r, "methods", None) or {"GET"}) - {"HEAD"}}
    # a served parameter ({kind}) is documented by its values or as a parameter
    missing = [r for r in served if not any(re.fullmatch(re.escape(r).replace(r"\{\}", "[^/]+"), d) for d in doc)]
    assert sorted(missing) == []
    assert _documented_routes("GET /api/v1/x/{a,b}?q=, POST /api/v1/y/{job}") == {
        "GET /api/v1/x/a", "GET /api/v1/x/b", "POST /api/v1/y/{}"}
