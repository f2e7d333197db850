-- cmdare collector schema, migration 009: input (data) workers' production, from
-- cmdare.agent.track's Run.produced (role "data"): per tick and per (job, run, rank), the
-- batches produced, their processing time and the time spent handing them to consumers.
-- analyze recommend data-workers / placement --job read it.
CREATE TABLE data_batches (
    id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, job VARCHAR,
    run VARCHAR, rank BIGINT, interval_seconds DOUBLE, batches BIGINT, elements DOUBLE,
    process_mean_seconds DOUBLE, process_p50_seconds DOUBLE, process_p95_seconds DOUBLE,
    idle_mean_seconds DOUBLE, idle_share_ratio DOUBLE, batches_per_second DOUBLE,
    dropped_total BIGINT
);
