"""What the agent remembers across its own restarts, in a small JSON file next to the spool
(``<spool.dir>/agent-state.json``): the boot it last saw (so the first start after a boot
publishes a ``boot`` event) and the revocation notices it already published during that
boot (so a restarted agent does not publish them again).  Written atomically; an
unreadable file is replaced, never fatal."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger("cmdare.agent.state")
MAX_NOTICES = 200


class AgentState:
    def __init__(self, directory: Path | str) -> None:
        self.path = Path(directory) / "agent-state.json"
        self.lock = threading.Lock()
        self.boot_time: float | None = None
        self.notices: list[str] = []
        try:
            d: Any = json.loads(self.path.read_text())
            if isinstance(d, dict):
                bt = d.get("boot_time")
                self.boot_time = float(bt) if isinstance(bt, (int, float)) else None
                ns = d.get("notices")
                self.notices = [n for n in ns if isinstance(n, str)] if isinstance(ns, list) else []
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            log.warning("%s: unreadable (%s); starting afresh", self.path, e)

    def new_boot(self, boot_time: float) -> bool:
        """Record ``boot_time``; True when it differs from the one last recorded (the
        machine rebooted since the agent last ran).  Notices of an earlier boot are
        forgotten."""
        with self.lock:
            new = self.boot_time is None or abs(self.boot_time - boot_time) > 2.0
            if new:
                self.boot_time, self.notices = boot_time, []
                self._save()
            return new

    def published(self, notice_id: str) -> bool:
        with self.lock:
            return notice_id in self.notices

    def add(self, notice_id: str) -> None:
        with self.lock:
            if notice_id not in self.notices:
                self.notices = (self.notices + [notice_id])[-MAX_NOTICES:]
                self._save()

    def _save(self) -> None:
        tmp = self.path.with_name(".agent-state.json.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w") as f:
                json.dump({"boot_time": self.boot_time, "notices": self.notices}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("%s: cannot write (%s)", self.path, e)
