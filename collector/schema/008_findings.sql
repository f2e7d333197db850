-- cmdare collector schema, migration 008: what the detectors concluded (analyze bottlenecks).
-- One row per finding; a run of some detectors over a scope replaces the rows of those
-- kinds (and that job, with --job) whose window overlaps the scope, so running it again
-- stores nothing twice.  first_detected survives the replacement (the same kind, job, node,
-- rank and subject found before); detected_at is the latest run that found it.
CREATE TABLE findings (
    kind           VARCHAR NOT NULL,   -- the detector: ps_bound, input_bound, straggler, ...
    job            VARCHAR,
    node           VARCHAR,
    rank           BIGINT,
    subject        VARCHAR,            -- a GPU (index:uuid), a PS node... within job / node
    severity       VARCHAR NOT NULL,   -- info | warning | critical
    confidence     DOUBLE NOT NULL,    -- 0..1
    window_start   TIMESTAMP,          -- the telemetry it stands on
    window_end     TIMESTAMP,
    summary        VARCHAR NOT NULL,
    evidence       JSON,               -- named numbers
    fit_ids        JSON,               -- stored model fits used
    suggests       JSON,               -- recommendation kinds that answer it
    first_detected TIMESTAMP NOT NULL,
    detected_at    TIMESTAMP NOT NULL
);
