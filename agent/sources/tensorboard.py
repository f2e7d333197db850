"""TensorBoard source: step telemetry for jobs that cannot be changed to use
``cmdare.agent.track``.

Every tick it looks for event files (``events.out.tfevents.*``) under the configured log
dirs, reads the records appended since the last tick (an incomplete record at the end is
left for the next tick), and emits:

- ``train_steps`` for each ``steps_tag`` point (``global_step/sec``), covering the steps
  since the run's previous point, with ``examples_tag`` (``examples/sec``) when present;
- ``train_scalar`` for each point of the tags listed in ``scalars``.

The run id is the event file's directory under the log dir (``.`` for the log dir itself),
the job id the ``job`` option or else the log dir's name.  Ids are derived from the points,
so files read again from the start (after an agent restart) are stored once downstream.
A corrupt file is reported and skipped; a file that shrinks (rewritten) is read again.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from cmdare.wire.plugin import Option
from cmdare.wire.tbevents import (
    EXAMPLES_TAG,
    STEPS_TAG,
    Point,
    StepConverter,
    parse_event,
    point_id,
    read_records,
)

from .base import SOURCES, Emit, Source, SourceUnavailable

log = logging.getLogger("cmdare.agent.tensorboard")
MAX_READ = 64 << 20  # bytes read from one file per tick; the rest waits for the next


class _File:
    def __init__(self, job: str, run: str, conv: StepConverter) -> None:
        self.job, self.run, self.conv = job, run, conv
        self.offset = 0
        self.bad: str | None = None


@SOURCES.register
class TensorBoardSource(Source):
    """Step telemetry and chosen scalars from the TensorBoard event files of jobs that
    cannot be changed."""

    name = "tensorboard"
    DEFAULT_ENABLED = False  # nothing to do until log dirs are configured
    OPTIONS = {
        "logdirs": Option("list", [], "TensorBoard log dirs to watch (event files anywhere below them)"),
        "job": Option("str", "", "job id for their runs (default: each log dir's name)"),
        "rank": Option("int", 0, "rank recorded with their step telemetry"),
        "steps_tag": Option("str", STEPS_TAG, "scalar holding the step rate"),
        "examples_tag": Option("str", EXAMPLES_TAG, "scalar holding examples per second"),
        "scalars": Option("list", [], "other scalar tags to forward as train_scalar events, e.g. loss"),
    }

    def __init__(self, config: dict[str, Any], **_: Any) -> None:
        super().__init__(config)
        self.files: dict[Path, _File] = {}
        self.convs: dict[tuple[str, str], StepConverter] = {}
        self.scalars = set(self.config["scalars"])

    def start(self) -> None:
        if not self.config["logdirs"]:
            raise SourceUnavailable("no log dirs configured (sources.tensorboard.logdirs)")

    def collect(self, emit: Emit) -> None:
        cfg = self.config
        problems = []
        for d in cfg["logdirs"]:
            root = Path(d)
            if not root.is_dir():
                continue  # the job has not started writing yet: normal
            job = cfg["job"] or root.resolve().name
            for path in sorted(root.rglob("*tfevents*")):
                st = self.files.get(path)
                if st is None:
                    run = path.parent.relative_to(root).as_posix()
                    key = (job, run)
                    conv = self.convs.get(key)
                    if conv is None:
                        conv = self.convs[key] = StepConverter(
                            run, cfg["rank"], cfg["steps_tag"], cfg["examples_tag"]
                        )
                    st = self.files[path] = _File(job, run, conv)
                if st.bad is None:
                    self._read(path, st, emit)
                if st.bad is not None:
                    problems.append(st.bad)
        if problems:
            raise RuntimeError(f"{len(problems)} event file(s) skipped: {problems[0]}")

    def _read(self, path: Path, st: _File, emit: Emit) -> None:
        try:
            size = path.stat().st_size
            if size < st.offset:
                log.info("tensorboard: %s shrank (rewritten?): reading it again", path)
                st.offset = 0
            if size == st.offset:
                return
            with path.open("rb") as f:
                f.seek(st.offset)
                buf = f.read(MAX_READ)
        except OSError as e:
            log.debug("tensorboard: %s: %s", path, e)  # removed between listing and reading
            return
        points: list[Point] = []
        used = 0
        try:
            for _n, end, rec in read_records(buf, 0, final=False):
                wall, step, scalars = parse_event(rec)
                points += [Point(wall, step, t, v, f"record@{st.offset + used}") for t, v in scalars]
                used = end
        except ValueError as e:
            st.bad = f"{path} at byte {st.offset + used}: {e}"
            log.error("tensorboard: %s: not read further", st.bad)
        st.offset += used
        src = path.name
        job, run = st.job, st.run
        for ts, data, p in st.conv.feed(points):
            emit("train_steps", data, ts, job=job, id=point_id(job, src, p))
        for p in points:
            if p.tag in self.scalars:
                emit(
                    "train_scalar",
                    {"run": run, "rank": self.config["rank"], "tag": p.tag, "step": p.step, "value": p.value},
                    p.wall,
                    job=job,
                    id=point_id(job, src, p),
                )
