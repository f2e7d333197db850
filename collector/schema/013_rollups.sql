-- 5-minute rollups of GPU samples (collector/rollup.py), and the time ranges per node that
-- writes touched since the last rollup run. Existing samples are marked pending: the
-- collector's first rollup run builds their rollup; reads are exact meanwhile (view gpu_5m).
CREATE TABLE gpu_rollup_5m (
    bucket TIMESTAMP NOT NULL, node VARCHAR NOT NULL, "index" BIGINT, uuid VARCHAR, name VARCHAR, job VARCHAR,
    samples BIGINT, util_sum DOUBLE, util_samples BIGINT, util_max DOUBLE, throttled BIGINT, throttle_samples BIGINT,
    mem_used_max BIGINT, mem_total_bytes BIGINT, power_sum DOUBLE, power_samples BIGINT, temp_max DOUBLE,
    first_ts TIMESTAMP, last_ts TIMESTAMP
);
CREATE TABLE rollup_dirty (node VARCHAR NOT NULL, lo TIMESTAMP NOT NULL, hi TIMESTAMP NOT NULL);
INSERT INTO rollup_dirty SELECT node, min(ts), max(ts) FROM gpu_samples GROUP BY node;
