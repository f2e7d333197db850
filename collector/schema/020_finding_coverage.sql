-- cmdare collector schema, migration 020: which stretches of time the detectors have looked
-- at (issue 51).  A detector run (analyze bottlenecks, the collector's schedule) records the
-- kinds it ran over [window_start, window_end], for one job or every job (job NULL); the
-- schedule extends its latest row while it keeps running.  A job whose time is covered and
-- has no finding was found healthy; one whose time is not covered was never looked at, and
-- goodput runs the detectors for it on first read.  Also in findings: resolved_at, set
-- when the schedule no longer finds a finding it found before.
CREATE TABLE finding_coverage (
    job          VARCHAR,
    kinds        VARCHAR[] NOT NULL,
    window_start TIMESTAMP NOT NULL,
    window_end   TIMESTAMP NOT NULL,
    ran_at       TIMESTAMP NOT NULL
);
ALTER TABLE findings ADD COLUMN resolved_at TIMESTAMP;
