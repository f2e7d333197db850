"""The contract of pluggable units (cmdare.wire.plugin, cmdare.analytics.units): typed
options with one-line errors, a registry by name, requirements checked up front, and
typed results that carry their evidence numbers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from cmdare.analytics.db import AnalyticsError
from cmdare.analytics.units import AnalyticsUnit, Finding, Recommendation, Scope, run_unit
from cmdare.collector.db import connect
from cmdare.wire.plugin import Option, Registry, Requirement, Unit
from cmdare.wire.units import ConfigError


class Probe(Unit):
    name = "probe"
    OPTIONS = {
        "ratio": Option("float", 0.5, "a share", lo=0.0, hi=1.0),
        "factor": Option("float", 3.0, "above one", lo=1.0, lo_open=True),
        "any": Option("float", 1.5, "any number"),
        "count": Option("int", 2, "a count", lo=1, hi=10),
        "mode": Option("str", "a", "one of", choices=("a", "b")),
        "every": Option("duration", 60.0, "how often"),
        "cap": Option("size", 1 << 20, "how much"),
        "on": Option("bool", True, "on or off"),
        "names": Option("list", [], "names"),
    }


def test_defaults_and_typed_values() -> None:
    assert Probe.parse_options("p", {}) == {k: o.default for k, o in Probe.OPTIONS.items()}
    got = Probe.parse_options(
        "p", {"ratio": "0.25", "factor": 2, "count": "7", "mode": "b", "every": "5m", "cap": "2MiB", "on": "no"}
    )
    assert (got["ratio"], got["factor"], got["count"], got["mode"]) == (0.25, 2.0, 7, "b")
    assert (got["every"], got["cap"], got["on"]) == (300.0, 2 << 20, False)


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"ratio": "1.5"}, "p.ratio: must be a number from 0 to 1, got '1.5'"),
        ({"ratio": "nan"}, "p.ratio: must be a number from 0 to 1, got 'nan'"),
        ({"factor": 1}, "p.factor: must be a number above 1, got 1"),
        ({"any": "x"}, "p.any: expected a number, got 'x'"),
        ({"any": True}, "p.any: expected a number, got True"),
        ({"count": 11}, "p.count: must be between 1 and 10, got 11"),
        ({"mode": "c"}, "p.mode: must be one of a, b, got 'c'"),
        ({"every": "soon"}, "p.every: expected a duration like 500ms, 10s, 5m or 24h, got 'soon'"),
        ({"names": "x"}, "p.names: expected a list of strings, got 'x'"),
        ({"colour": 1}, "unknown key 'p.colour' (known: any, cap, count, every, factor, mode, names, on, ratio)"),
    ],
)
def test_a_bad_option_is_a_one_line_error_naming_the_key(raw, message) -> None:
    with pytest.raises(ConfigError) as e:
        Probe.parse_options("p", raw)
    assert str(e.value) == message


def test_registry_finds_units_by_name_and_refuses_what_is_not_a_unit() -> None:
    reg: Registry[type[Unit]] = Registry("probe")
    reg.register(Probe)
    assert reg.get("probe") is Probe and "probe" in reg and list(reg) == ["probe"]
    with pytest.raises(ConfigError, match=r"^unknown probe 'nope' \(known: probe\)$"):
        reg.get("nope")

    class Bad(Unit):
        name = "Bad-Name"

    with pytest.raises(AssertionError, match="lower_snake_case"):
        reg.register(Bad)

    class Tuples(Unit):
        name = "tuples"
        OPTIONS = {"x": ("int", 1, "old style")}  # type: ignore[dict-item]

    with pytest.raises(AssertionError, match="must be an Option"):
        reg.register(Tuples)


class Idle(AnalyticsUnit):
    """A detector-shaped unit for the test: GPUs whose mean utilisation is below a bound."""

    name = "idle_probe"
    RESULT = Finding
    OPTIONS = {"below": Option("float", 0.1, "utilisation share", lo=0.0, hi=1.0)}
    REQUIRES = (Requirement("table", "gpu_samples"),)

    def run(self, con, scope: Scope) -> list[Finding]:
        where, params = scope.where(job="job")
        rows = con.execute(
            f"SELECT node, uuid, avg(util_gpu_ratio), count(*) FROM gpu_samples WHERE {where} "
            "GROUP BY ALL HAVING avg(util_gpu_ratio) < ? ORDER BY node",
            [*params, self.options["below"]],
        ).fetchall()
        return [
            Finding(self.name, scope.job, f"GPU {u} on {n} idle", node=n, subject=u,
                    evidence={"util_mean_ratio": m, "samples": k})
            for n, u, m, k in rows
        ]


class NeedsFit(AnalyticsUnit):
    name = "needs_fit"
    RESULT = Recommendation
    REQUIRES = (Requirement("fit", "cluster"),)


@pytest.fixture()
def db(tmp_path: Path):
    con = connect(tmp_path / "u.duckdb")
    yield con
    con.close()


def test_an_analytics_unit_runs_with_its_scope_and_returns_evidence(db) -> None:
    reg: Registry[type[AnalyticsUnit]] = Registry("detector")
    reg.register(Idle)
    reg.register(NeedsFit)
    with pytest.raises(AnalyticsError, match=r"^detector idle_probe cannot run: no rows in gpu_samples yet$"):
        run_unit(reg, "idle_probe", db, Scope(), {})
    db.execute("""INSERT INTO gpu_samples_packed (id, ts, node, job, uuid, util_gpu_ratio) VALUES
        ('1', '2026-01-01 00:00:00', 'a', 'j1', 'G0', 0.05), ('2', '2026-01-01 00:00:10', 'a', 'j1', 'G0', 0.0),
        ('3', '2026-01-01 00:00:00', 'b', 'j2', 'G1', 0.02), ('4', '2026-01-01 00:00:00', 'c', 'j1', 'G2', 0.9)""")
    got = run_unit(reg, "idle_probe", db, Scope(job="j1"), {"below": "0.5"})
    assert [(f.node, f.subject, f.evidence) for f in got] == [("a", "G0", {"util_mean_ratio": 0.025, "samples": 2})]
    assert got[0].to_json()["evidence"] == {"util_mean_ratio": 0.025, "samples": 2}
    assert len(run_unit(reg, "idle_probe", db, Scope(), {})) == 2
    with pytest.raises(AnalyticsError, match=r"^idle_probe.below: must be a number from 0 to 1, got '2'$"):
        run_unit(reg, "idle_probe", db, Scope(), {"below": "2"})
    with pytest.raises(AnalyticsError, match=r"no cluster model fitted yet \(run analyze fit cluster\)$"):
        run_unit(reg, "needs_fit", db, Scope(), {})


def test_a_missing_module_is_named_up_front() -> None:
    class Tpu(Unit):
        name = "tpu_probe"
        REQUIRES = (Requirement("module", "no_such_module_xyz", "install cmdare[tpu]"),)

    reg: Registry[type[Unit]] = Registry("source")
    reg.register(Tpu)
    with pytest.raises(ConfigError) as e:
        reg.check("tpu_probe")
    assert str(e.value) == (
        "source tpu_probe cannot run: Python module 'no_such_module_xyz' is not installed; install cmdare[tpu]"
    )


def test_results_refuse_evidence_that_is_not_a_number() -> None:
    with pytest.raises(AssertionError, match="evidence 'x' is nan"):
        Finding("k", None, "s", evidence={"x": math.nan})
    with pytest.raises(AssertionError, match="confidence"):
        Finding("k", None, "s", confidence=1.5)
    r = Recommendation("cluster", {"workers": 4, "ps": 1}, {"steps_per_second": 2.5}, "why",
                       interval={"steps_per_second": (2.0, 3.0)}, fit_ids=("f1",))
    assert r.to_json()["interval"] == {"steps_per_second": [2.0, 3.0]} and r.to_json()["fit_ids"] == ["f1"]
