-- cmdare collector schema, migration 003: parameter-server count on job declarations, scalars
-- other than step rate (agent source "tensorboard", analyze import tensorboard), TPU samples.

ALTER TABLE jobs ADD COLUMN ps BIGINT;

-- One row per scalar point (tag, step, value) of a run, e.g. loss.
CREATE TABLE scalars (
    id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, job VARCHAR,
    run VARCHAR, rank BIGINT, tag VARCHAR, step BIGINT, value DOUBLE
);

-- libtpu runtime metrics per TPU device (agent source "tpu").
CREATE TABLE tpu_samples (
    id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, job VARCHAR,
    device BIGINT, hbm_used_bytes BIGINT, hbm_total_bytes BIGINT, duty_cycle_ratio DOUBLE,
    hbm_bandwidth_ratio DOUBLE
);
