-- cmdare collector schema, migration 002: training-job telemetry from cmdare.agent.track
-- (agent source "train") and from TensorBoard imports.  The envelope column job holds the
-- training job's id; run and rank tell its runs and processes apart.

-- One row per job declaration (each process declares itself when it starts).
CREATE TABLE jobs (
    id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, job VARCHAR,
    run VARCHAR, rank BIGINT, world_size BIGINT, role VARCHAR, pid BIGINT,
    model VARCHAR, params BIGINT, tensors BIGINT, flops_per_step DOUBLE, batch_size BIGINT,
    framework VARCHAR, framework_version VARCHAR, accelerator VARCHAR
);

-- Per-interval step aggregates per (job, run, rank); ts = end of the last step.
CREATE TABLE steps (
    id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, job VARCHAR,
    run VARCHAR, rank BIGINT, interval_seconds DOUBLE, steps BIGINT,
    first_step BIGINT, last_step BIGINT, examples DOUBLE,
    step_mean_seconds DOUBLE, step_p50_seconds DOUBLE, step_p95_seconds DOUBLE, step_max_seconds DOUBLE,
    wait_mean_seconds DOUBLE, wait_p50_seconds DOUBLE, wait_p95_seconds DOUBLE, wait_max_seconds DOUBLE,
    wait_share_ratio DOUBLE, steps_per_second DOUBLE, examples_per_second DOUBLE, dropped_total BIGINT
);

-- Single steps well above the rank's recent median step time.
CREATE TABLE slow_steps (
    id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, job VARCHAR,
    run VARCHAR, rank BIGINT, step BIGINT, step_seconds DOUBLE, wait_seconds DOUBLE,
    median_seconds DOUBLE, examples DOUBLE
);

CREATE TABLE checkpoints (
    id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, job VARCHAR,
    run VARCHAR, rank BIGINT, action VARCHAR, seconds DOUBLE, bytes BIGINT, step BIGINT,
    path VARCHAR, ok BOOLEAN, error VARCHAR
);

-- step_hardware (steps next to their node's GPU and CPU use) is a view:
-- analytics/sql/step_hardware.sql, re-created on every writable open.
