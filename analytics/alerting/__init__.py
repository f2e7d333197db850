"""Alerting rules: YAML files in Prometheus's shape, evaluated against the database, with
Prometheus's ``for`` / ``keep_firing_for`` semantics and state kept in DuckDB.

A rule file::

    groups:
      - name: nodes
        interval: 15s
        rules:
          - alert: NodeLost
            expr: |
              SELECT node, job, 1 AS value FROM instance_lives(asof_ts := eval_time())
              WHERE end_reason = 'lost' AND last_seen >= eval_time() - INTERVAL 1 HOUR
            for: 0s
            keep_firing_for: 5m
            labels: {severity: critical}
            annotations:
              summary: "node {{ $labels.node }} lost without a revocation notice"
          - alert: InputBound
            finding: input_bound          # fires per finding of this detector
            filters: {min_severity: warning, min_confidence: 0.5}
            window: 15m                   # the telemetry the detector reads

- ``expr``: one SELECT over the documented tables and views; each row is one alert
  instance, its columns its labels (``value``, when present, its value; else 1).
  ``eval_time()`` is the evaluation's time (UTC), so rules are testable.
- ``finding: KIND``: the detector runs over the last ``window`` at each evaluation; each
  finding is an instance labelled ``kind``, ``job``, ``node``, ``rank``, ``subject``,
  ``severity``, valued by its confidence; ``{{ $summary }}`` is its summary.
- ``for``, ``keep_firing_for``, ``labels``, ``annotations`` as Prometheus defines them; the
  annotations take ``{{ $labels.NAME }}``, ``{{ $value }}`` and ``{{ printf "%.2f" $value }}``.
- ``inhibit_on_revocation: true`` (cmdare's): an instance whose ``node`` (or whose ``job``'s
  nodes) ended a life revoked within the inhibition window is ``inhibited``: shown, not sent.

Loading validates everything and says, in one line, which file, group and rule is wrong.

The package: ``rulefmt`` (the file format, bounded), ``evaluate`` (one rule's instances),
``state`` (the state machine, persisted), ``schedule`` (a runner per group in the
collector), ``ruletest`` (``analyze alerts test``), ``notify`` (the receivers).
"""

from .evaluate import Instance, columns_of, evaluate, fingerprint, listing, prepare, render, utcnow, validate
from .rulefmt import (
                      DEFAULT_INTERVAL,
                      DEFAULT_WINDOW,
                      FINDING_FILTERS,
                      FINDING_LABELS,
                      SEVERITIES,
                      Group,
                      Rule,
                      RuleError,
                      load_files,
                      load_texts,
                      parse_yaml,
                      read_files,
                      resolve_paths,
)
from .ruletest import TEST_BASE, TestResult, run_tests
from .state import RESOLVED_RETENTION, Alert, Engine, RuleHealth

__all__ = [
    "DEFAULT_INTERVAL", "DEFAULT_WINDOW", "FINDING_FILTERS", "FINDING_LABELS", "RESOLVED_RETENTION", "SEVERITIES",
    "TEST_BASE", "Alert", "Engine", "Group", "Instance", "Rule", "RuleError", "RuleHealth", "TestResult",
    "columns_of", "evaluate", "fingerprint", "listing", "load_files", "load_texts", "parse_yaml", "prepare",
    "read_files", "render", "resolve_paths", "run_tests", "utcnow", "validate",
]
