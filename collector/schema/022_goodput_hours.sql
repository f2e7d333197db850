-- cmdare collector schema, migration 022: goodput by the hour, kept as data arrives
-- (analytics/goodput/goodhours.py). One row a job and hour with data: the seconds of each category
-- but idle in that hour, as the raw sweep gives them, whether the hour lies whole inside the
-- job's span (readers use only those), and the fingerprint of the rollup rows and
-- checkpoints they were computed from; a reader uses a row only while the fingerprint it
-- computes now is the same, and reads every other hour raw.
CREATE TABLE goodput_hours (
    job VARCHAR NOT NULL, hour TIMESTAMP NOT NULL, fp VARCHAR NOT NULL, whole BOOLEAN NOT NULL,
    productive DOUBLE NOT NULL, input_wait DOUBLE NOT NULL, startup DOUBLE NOT NULL,
    checkpoint_save DOUBLE NOT NULL, checkpoint_restore DOUBLE NOT NULL, revocation DOUBLE NOT NULL,
    PRIMARY KEY (job, hour)
);
