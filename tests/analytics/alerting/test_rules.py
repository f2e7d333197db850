"""Rule files: validated on load, each problem one line naming the file, group and rule;
`analyze alerts check` and `analyze alerts` as a user runs them."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from cmdare.analytics import alerting as alerts
from cmdare.analytics.cli import cli
from tests.analytics.alerting.conftest import at, engine, insert


def rules(body: str) -> str:
    return "groups:\n  - name: g\n    rules:\n" + textwrap.indent(textwrap.dedent(body), "      ")


BAD = [
    ("groups: [1, 2", "not valid YAML"),
    ("rules: []", "expected a mapping with one key, groups"),
    ("groups:\n  - rules: []", "group 1: needs a name"),
    ("groups:\n  - name: g\n    interval: 0.5s\n    rules: []", "group 'g': interval must be at least 1s"),
    ("groups:\n  - name: g\n    every: 1m", "group 'g': unknown key 'every'"),
    (rules("- alert: A\n  expr: SELECT 1\n  for: soon"), "rule 'A': for: expected a duration"),
    (rules("- alert: A\n  expr: SELECT 1\n  finding: ps_bound"), "rule 'A': give exactly one of expr"),
    (rules("- alert: A"), "rule 'A': give exactly one of expr"),
    (rules("- alert: A B\n  expr: SELECT 1"), "rule 1: alert must be a name"),
    (rules("- alert: A\n  finding: cpu_melting"), "rule 'A': finding 'cpu_melting' is not a detector"),
    (rules("- alert: A\n  finding: ps_bound\n  filters: {team: x}"), "rule 'A': filters: unknown key 'team'"),
    (rules("- alert: A\n  finding: ps_bound\n  filters: {min_confidence: 2}"), "min_confidence must be a number from 0 to 1"),
    (rules("- alert: A\n  expr: SELECT 1\n  labels: {bad-name: x}"), "labels: 'bad-name' is not a valid label name"),
    (rules("- alert: A\n  expr: SELECT 1\n  annotations: {s: '{{ .Labels.node }}'}"), "s: unsupported template"),
    (rules("- alert: A\n  expr: SELECT 1\n- alert: A\n  expr: SELECT 2"), "rule 'A': two rules of this name"),
    (rules("- alert: A\n  expr: SELECT 1\n  severity: high"), "rule 'A': unknown key 'severity'"),
    (rules("- alert: A\n  expr: SELECT nodee FROM heartbeats"), 'rule \'A\': expr: Binder Error: Referenced column "nodee"'),
    (rules("- alert: A\n  expr: SELECT * FROM nowhere"), "rule 'A': expr: Catalog Error: Table with name nowhere"),
    (rules("- alert: A\n  expr: DELETE FROM heartbeats"), "rule 'A': expr: only SELECT queries may run here"),
    (rules("- alert: A\n  expr: SELECT 1; SELECT 2"), "rule 'A': expr: one statement at a time"),
    (rules("- alert: A\n  expr: SELECT node, 'x' AS value FROM heartbeats"), "the value column must be a number"),
    (rules("- alert: A\n  expr: SELECT node FROM heartbeats\n  annotations: {s: '{{ $labels.gpu }}'}"),
     "s: $labels.gpu is not a column of the expression (columns: node)"),
]


@pytest.mark.parametrize(("text", "msg"), BAD, ids=[m[:40] for _, m in BAD])
def test_bad_rule_files_are_one_line_errors(con: duckdb.DuckDBPyConnection, tmp_path: Path, text: str,
                                            msg: str) -> None:
    f = tmp_path / "r.yml"
    f.write_text(text)
    with pytest.raises(alerts.RuleError) as e:
        alerts.validate(con, alerts.load_files([f]))
    line = str(e.value)
    assert "\n" not in line and line.startswith(str(f)) and msg in line, line


def test_check_command_exit_codes(tmp_path: Path) -> None:
    good = tmp_path / "good.yml"
    good.write_text(rules("- alert: A\n  expr: SELECT node FROM heartbeats\n  for: 1m"))
    bad = tmp_path / "bad.yml"
    bad.write_text(rules("- alert: B\n  expr: SELECT nodee FROM heartbeats").replace("name: g", "name: g2"))
    db = str(tmp_path / "none.duckdb")  # no database: checked against the current schema
    r = CliRunner().invoke(cli, ["alerts", "check", str(good), "--db", db])
    assert r.exit_code == 0 and "1 file(s), 1 group(s), 1 rule(s): ok" in r.output
    r = CliRunner().invoke(cli, ["alerts", "check", str(good), str(bad), "--db", db])
    assert r.exit_code == 1 and f"Error: {bad}: group 'g2': rule 'B': expr: Binder Error" in r.output
    r = CliRunner().invoke(cli, ["alerts", "check", "--db", db, "default"])  # the shipped pack
    assert r.exit_code == 0 and "4 group(s), 16 rule(s): ok" in r.output
    r = CliRunner().invoke(cli, ["alerts", "check", str(tmp_path / "missing.yml"), "--db", db])
    assert r.exit_code == 1 and "cannot read" in r.output
    r = CliRunner().invoke(cli, ["alerts", "check", str(good), "--db", db, "--json"])  # issue 66: --json too
    assert r.exit_code == 0 and json.loads(r.stdout) == {"ok": True, "files": [str(good)], "groups": 1, "rules": 1,
                                                         "skipped": []}
    r = CliRunner().invoke(cli, ["alerts", "check", str(good), str(bad), "--db", db, "--json"])
    assert r.exit_code == 1 and r.stdout == "" and "rule 'B'" in r.stderr  # an error stays one line on stderr


def test_the_shipped_pack_validates(con: duckdb.DuckDBPyConnection) -> None:
    from cmdare.analytics.alerting import resolve_paths as rule_paths

    groups = alerts.load_files(rule_paths(("default",)))
    alerts.validate(con, groups)
    assert sum(len(g.rules) for g in groups) == 16


def test_analyze_alerts_lists_state_since_value_labels_and_health(con: duckdb.DuckDBPyConnection,
                                                                 tmp_path: Path) -> None:
    e = engine(con, tmp_path, rules("""
        - alert: Seen
          expr: SELECT node, 7 AS value FROM heartbeats WHERE ts <= eval_time()
          annotations: {summary: "{{ $labels.node }} seen"}
        - alert: Labelled
          expr: SELECT node, temp FROM (SELECT node, 1 AS temp FROM heartbeats WHERE ts > eval_time())
    """))
    insert(con, "heartbeats", ts=at(0), node="n1", seq=1)
    for g in e.groups:
        e.eval_group(con, g, at(5))
        e.save(con, g, at(5))
    db = tmp_path / "a.duckdb"
    con.execute(f"ATTACH '{db}' AS f")
    con.execute("COPY FROM DATABASE memory TO f")
    con.execute("DETACH f")
    r = CliRunner().invoke(cli, ["alerts", "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    [a] = [x for x in out["alerts"] if x["rule"] == "g/Seen"]
    assert a["state"] == "firing" and a["value"] == 7 and a["labels"] == {"node": "n1", "alertname": "Seen"}
    assert a["since"] == "2026-11-24 12:00:05" and a["summary"] == "n1 seen"
    assert {x["rule"]: x["health"] for x in out["rules"]} == {"g/Seen": "ok", "g/Labelled": "ok"}
    r = CliRunner().invoke(cli, ["alerts", "--db", str(db)])
    assert r.exit_code == 0 and "g/Seen" in r.output and "node=n1" in r.output and "2 rules, 2 healthy" in r.output


RULE_FILE = """
groups:
  - name: gpus
    interval: 30s
    rules:
      - alert: GpuHot
        expr: |
          SELECT node, CAST("index" AS VARCHAR) AS gpu, max(temp_celsius) AS value
          FROM gpu_samples WHERE ts > eval_time() - INTERVAL 2 MINUTE AND ts <= eval_time()
          GROUP BY ALL HAVING max(temp_celsius) > 85
        for: 2m
        labels: {severity: warning}
        annotations:
          summary: 'GPU {{ $labels.gpu }} on {{ $labels.node }} at {{ printf "%.0f" $value }} C'
"""

TEST_FILE = """
rule_files: [rules.yml]
evaluation_interval: 30s
tests:
  - name: a hot GPU fires after 2 minutes
    rows:
      gpu_samples:
        - {ts: 0s, node: n1, index: 0, temp_celsius: 90}
        - {ts: 1m, node: n1, index: 0, temp_celsius: 91}
        - {ts: 2m, node: n1, index: 0, temp_celsius: 92}
        - {ts: 3m, node: n2, index: 1, temp_celsius: 60}
    alert_rule_test:
      - eval_time: 1m
        alertname: GpuHot
        exp_alerts: []
      - eval_time: 2m
        alertname: GpuHot
        exp_alerts:
          - exp_labels: {node: n1, gpu: "0", severity: warning}
            exp_annotations: {summary: "GPU 0 on n1 at 92 C"}
  - name: WRONG
    rows:
      gpu_samples:
        - {ts: 0s, node: n1, index: 0, temp_celsius: 90}
    alert_rule_test:
      - eval_time: 30s
        alertname: GpuHot
        exp_alerts:
          - exp_labels: {node: n1, gpu: "0", severity: warning}
"""


def test_unit_tests_of_rules_as_promtool_runs_them(tmp_path: Path) -> None:
    (tmp_path / "rules.yml").write_text(RULE_FILE)
    t = tmp_path / "rules.test.yml"
    t.write_text(TEST_FILE.replace("  - name: WRONG", "  - name: not yet"))
    r = CliRunner().invoke(cli, ["alerts", "test", str(t)])
    assert r.exit_code == 1, r.output
    assert "ok   a hot GPU fires after 2 minutes" in r.output
    # pending at 30 s (for: 2m): not firing, so the expectation fails, and says why
    assert "FAIL not yet\n     at 30s: GpuHot: expected firing {'node': 'n1', 'gpu': '0', 'severity': 'warning'}; " \
           "got none" in r.output
    assert "2 test(s), 1 failed" in r.output
    r = CliRunner().invoke(cli, ["alerts", "test", str(t), "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and doc["failed"] == 1
    assert [(x["name"], x["ok"]) for x in doc["tests"]] == [("a hot GPU fires after 2 minutes", True), ("not yet", False)]
    assert doc["tests"][1]["failures"][0].startswith("at 30s: GpuHot: expected firing")
    t.write_text(TEST_FILE.split("  - name: WRONG")[0])
    assert CliRunner().invoke(cli, ["alerts", "test", str(t)]).exit_code == 0
    t.write_text(TEST_FILE.replace("gpu_samples:\n        - {ts: 0s, node: n1, index: 0, temp_celsius: 90}\n        - {ts: 1m",
                                   "gpu_samples:\n        - {ts: 0s, node: n1, temperature: 90}\n        - {ts: 1m"))
    r = CliRunner().invoke(cli, ["alerts", "test", str(t)])
    assert r.exit_code == 1 and "rows.gpu_samples: no column 'temperature'" in r.output


PACKED_RULES = """
groups:
  - name: depth
    rules:
      - alert: RowRemapPending
        expr: |
          SELECT node, CAST("index" AS VARCHAR) AS gpu, max(tensor_active_ratio) AS value
          FROM gpu_samples WHERE ts > eval_time() - INTERVAL 1 MINUTE AND ts <= eval_time() AND row_remap_pending
          GROUP BY ALL
        labels: {severity: critical}
"""

PACKED_TEST = """
rule_files: [rules.yml]
evaluation_interval: 30s
tests:
  - name: fields stored packed are rows of a test like any other
    rows:
      gpu_samples:
        - {ts: 0s, node: n1, index: 0, tensor_active_ratio: 0.25, row_remap_pending: true, mig_profile: 1g.10gb}
        - {ts: 0s, node: n2, index: 1, tensor_active_ratio: 0.5, row_remap_pending: false}
    alert_rule_test:
      - eval_time: 30s
        alertname: RowRemapPending
        exp_alerts:
          - exp_labels: {node: n1, gpu: "0", severity: critical}
"""


def test_rule_tests_write_gpu_depth_fields_through_the_view(tmp_path: Path) -> None:
    """GPU samples are stored packed (collector/ingest/storage.py): a rule test's rows name
    the fields as queries read them; a value of the wrong type is a one-line error."""
    (tmp_path / "rules.yml").write_text(PACKED_RULES)
    t = tmp_path / "rules.test.yml"
    t.write_text(PACKED_TEST)
    r = CliRunner().invoke(cli, ["alerts", "test", str(t)])
    assert r.exit_code == 0 and "1 test(s)" in r.output, r.output
    t.write_text(PACKED_TEST.replace("tensor_active_ratio: 0.25", "tensor_active_ratio: lots"))
    r = CliRunner().invoke(cli, ["alerts", "test", str(t)])
    assert r.exit_code == 1 and "rows.gpu_samples: " in r.output and "lots" in r.output, r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) <= 3, r.output


def test_the_shipped_example_tests_pass() -> None:
    from cmdare.analytics.api import empty_db as _empty_db

    results = alerts.run_tests(Path(alerts.__file__).parents[1] / "rules" / "cmdare.test.yml", _empty_db)
    assert len(results) == 2 and all(not r.failures for r in results), results
