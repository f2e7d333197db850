"""Rule files as an attacker writes them: bounded in size, nesting and alias expansion,
every wrong type a one-line error quoting a short excerpt (issue 32), and a fuzz of the
loader over thousands of generated files: nothing but a loaded file or a RuleError."""

from __future__ import annotations

import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cmdare.analytics import alerting
from cmdare.analytics.alerting.rulefmt import MAX_FILE_BYTES
from tests.conftest import examples


def _refused(text: str, match: str = "") -> str:
    t0 = time.monotonic()
    with pytest.raises(alerting.RuleError) as e:
        alerting.load_texts([("r.yml", text)])
    assert time.monotonic() - t0 < 5, "a bounded check, not a walk of the expansion (a walk takes minutes)"
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 400, msg[:500]
    assert match in msg, msg
    return msg


def test_an_alias_bomb_is_refused_at_once_in_one_short_line() -> None:
    bomb = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for i, c in enumerate("bcdefgh"):
        prev = "abcdefgh"[i]
        bomb.append(f"{c}: &{c} [{','.join(['*' + prev] * 9)}]")
    bomb.append("groups: [*h]")
    text = "\n".join(bomb)
    assert len(text) < 400
    _refused(text, "once its aliases are expanded")


def test_deep_nesting_recursive_aliases_and_huge_files_are_refused() -> None:
    _refused("groups: " + "[" * 200 + "]" * 200, "nested more than")
    _refused("groups: " + "[" * 100_000, "nested more than")
    _refused("groups: &a [*a]", "refers to itself")
    _refused("# " + "x" * MAX_FILE_BYTES, "larger than 1 MiB")


@pytest.mark.parametrize("rule,match", [
    ("{alert: A, finding: [a, list]}", "is not a detector"),
    ("{alert: A, finding: {a: 1}}", "is not a detector"),
    ("{alert: A, expr: [1, 2]}", "expr must be a SELECT"),
    ("{alert: A, expr: SELECT 1, for: [1]}", "for: expected a duration"),
    ("{alert: A, expr: SELECT 1, for: .inf}", "for: expected a duration"),
    ("{alert: A, expr: SELECT 1, for: .nan}", "for: expected a duration"),
    ("{alert: A, expr: SELECT 1, keep_firing_for: 99999999d}", "at most 30d"),
    ("{alert: A, expr: SELECT 1, labels: [x]}", "labels must be a mapping"),
    ("{alert: A, expr: SELECT 1, labels: {1: x}}", "not a valid label name"),
    ("{alert: A, expr: SELECT 1, annotations: {summary: {a: b}}}", "must be a string"),
    ("{alert: A, expr: SELECT 1, 7: x}", "unknown key"),
    ("{alert: A, finding: input_bound, filters: {job: [x]}}", "filters.job must be a name"),
    ("{alert: A, finding: input_bound, filters: {min_confidence: .nan}}", "min_confidence"),
    ("{alert: [A], expr: SELECT 1}", "alert must be a name"),
    ("[1, 2, 3]", "expected a mapping"),
])
def test_every_wrong_type_is_one_line(rule: str, match: str) -> None:
    _refused(f"groups:\n  - name: g\n    rules:\n      - {rule}\n", match)


def test_an_error_quotes_only_a_short_excerpt() -> None:
    msg = _refused("groups:\n  - name: g\n    interval: " + "9" * 5000 + "x\n")
    assert "9" * 100 not in msg


# -- fuzz -----------------------------------------------------------------------------------
KEYS = ["groups", "name", "interval", "rules", "alert", "expr", "finding", "filters", "window", "for",
        "keep_firing_for", "labels", "annotations", "inhibit_on_revocation", "job", "node", "min_severity",
        "min_confidence", "summary", "x"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["g", "A", "SELECT 1 AS value", "input_bound", "10s", "-1s", "warning", "{{ $value }}",
                     '{{ printf "%%" $value }}', "{{ $labels.x }}", "1e999", "30d", "", "\u0000"]),
    st.text(max_size=20),
)
trees = st.recursive(scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.sampled_from(KEYS), kids, max_size=5)), max_leaves=30)


@settings(max_examples=examples(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees)
def test_fuzz_generated_structures_load_or_fail_in_one_line(tree) -> None:
    text = yaml.safe_dump({"groups": [tree]} if isinstance(tree, dict) else tree, allow_unicode=True)
    try:
        alerting.load_texts([("f.yml", text)])
    except alerting.RuleError as e:
        assert "\n" not in str(e) and len(str(e)) < 600


@settings(max_examples=examples(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(alphabet=st.sampled_from(list("[]{}:&*!|>-,'\"\n #ab1%?@`\t")), max_size=200))
def test_fuzz_raw_text_loads_or_fails_in_one_line(text: str) -> None:
    try:
        alerting.load_texts([("f.yml", text)])
    except alerting.RuleError as e:
        assert "\n" not in str(e) and len(str(e)) < 600
