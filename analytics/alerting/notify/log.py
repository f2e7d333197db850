"""The log receiver: one line per change of an alert's state."""

from __future__ import annotations

import logging

from ..state import Engine

log = logging.getLogger("cmdare.alerts")


class LogReceiver:
    def __init__(self) -> None:
        self.last: dict[tuple[str, str], str] = {}

    def restore(self, engine: Engine) -> None:
        """What was already known is not new."""
        self.last = {(a.rule, a.fingerprint): a.state for a in engine.snapshot()}

    def round(self, engine: Engine, rules: set[str]) -> None:
        now = {(a.rule, a.fingerprint): a for a in engine.snapshot() if a.rule in rules}
        for key, a in now.items():
            if self.last.get(key) != a.state:
                labels = ",".join(f"{k}={v}" for k, v in sorted(a.labels.items()) if k != "alertname")
                extra = f" ({a.inhibited_by})" if a.inhibited_by else ""
                log.warning("alert %s %s{%s} value=%g%s: %s", a.rule, a.state, labels[:500], a.value, extra,
                            a.annotations.get("summary", "")[:500])
        for key in [k for k in self.last if k[0] in rules and k not in now]:
            del self.last[key]
        self.last.update({k: a.state for k, a in now.items()})
