"""Under CI (CI=true) a test that cannot run fails with its one-line reason instead of
skipping, so that CI cannot go green while whole suites are skipped; outside CI it skips.
Only tests marked ``gpu`` may skip in CI (no GPU there)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PROBES = ROOT / "tests" / "fixtures" / "ci_probe"


def run(ci: str | None, probe: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(PROBES / probe)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # waits on purpose, or runs pytest itself, for seconds (fast tier: docs/testing.md)
@pytest.mark.parametrize("ci", ["true", "1"])
def test_under_ci_a_skip_is_a_failure_with_its_reason(ci: str) -> None:
    r = run(ci, "probe_tests.py")
    assert r.returncode == 1, r.stdout
    assert "1 failed, 1 passed, 1 skipped, 1 error" in r.stdout, r.stdout
    assert "CI=true does not pass without it: widget-tool is not installed here" in r.stdout
    assert "CI=true does not pass without it: the data set is not at /nowhere" in r.stdout
    assert "SKIPPED [1] tests/fixtures/ci_probe/probe_tests.py" in r.stdout  # the gpu test only
    r = run(ci, "probe_ci.py")  # a module skipped at import
    assert r.returncode != 0 and "a_module_nobody_has is not installed" in r.stdout, r.stdout


@pytest.mark.slow  # waits on purpose, or runs pytest itself, for seconds (fast tier: docs/testing.md)
@pytest.mark.parametrize("ci", [None, "false", ""])
def test_outside_ci_they_skip(ci: str | None) -> None:
    r = run(ci, "probe_tests.py")
    assert r.returncode == 0 and "1 passed, 3 skipped" in r.stdout, r.stdout
    assert run(ci, "probe_ci.py").returncode == 5  # nothing collected, nothing failed
