-- 1-minute rollups and per-host and per-(job, rank) rollups (collector/rollup.py, one definition
-- per rollup), the SM clock while throttled and not, pending ranges per source table, and the raw retention horizon (raw rows before it
-- are deleted; their rollup rows stay). Every rolled table's rows are marked pending: the
-- collector's first rollup run builds them; reads are exact meanwhile (the views).
ALTER TABLE rollup_dirty ADD COLUMN src VARCHAR DEFAULT 'gpu_samples';
CREATE TABLE rollup_horizon (src VARCHAR NOT NULL, before TIMESTAMP NOT NULL);
ALTER TABLE gpu_rollup_5m ADD COLUMN clk_thr_sum DOUBLE;
ALTER TABLE gpu_rollup_5m ADD COLUMN clk_thr_n BIGINT;
ALTER TABLE gpu_rollup_5m ADD COLUMN clk_ok_sum DOUBLE;
ALTER TABLE gpu_rollup_5m ADD COLUMN clk_ok_n BIGINT;
CREATE TABLE gpu_rollup_1m ("bucket" TIMESTAMP NOT NULL, "node" VARCHAR NOT NULL, "index" BIGINT, "uuid" VARCHAR, "name" VARCHAR, "job" VARCHAR, "samples" BIGINT, "util_sum" DOUBLE, "util_samples" BIGINT, "util_max" DOUBLE, "throttled" BIGINT, "throttle_samples" BIGINT, "mem_used_max" BIGINT, "mem_total_bytes" BIGINT, "power_sum" DOUBLE, "power_samples" BIGINT, "temp_max" DOUBLE, "first_ts" TIMESTAMP, "last_ts" TIMESTAMP, "mem_sum" DOUBLE, "mem_samples" BIGINT, "thr_mask" BIGINT, "clk_thr_sum" DOUBLE, "clk_thr_n" BIGINT, "clk_ok_sum" DOUBLE, "clk_ok_n" BIGINT);
CREATE TABLE host_rollup_1m ("bucket" TIMESTAMP NOT NULL, "node" VARCHAR NOT NULL, "job" VARCHAR, "samples" BIGINT, "cpu_sum" DOUBLE, "cpu_samples" BIGINT, "cpu_max" DOUBLE, "mem_used_sum" DOUBLE, "mem_used_samples" BIGINT, "mem_used_max" BIGINT, "mem_total_bytes" BIGINT, "load1_sum" DOUBLE, "load1_samples" BIGINT, "first_ts" TIMESTAMP, "last_ts" TIMESTAMP);
CREATE TABLE host_rollup_5m ("bucket" TIMESTAMP NOT NULL, "node" VARCHAR NOT NULL, "job" VARCHAR, "samples" BIGINT, "cpu_sum" DOUBLE, "cpu_samples" BIGINT, "cpu_max" DOUBLE, "mem_used_sum" DOUBLE, "mem_used_samples" BIGINT, "mem_used_max" BIGINT, "mem_total_bytes" BIGINT, "load1_sum" DOUBLE, "load1_samples" BIGINT, "first_ts" TIMESTAMP, "last_ts" TIMESTAMP);
CREATE TABLE step_rollup_1m ("bucket" TIMESTAMP NOT NULL, "job" VARCHAR, "run" VARCHAR, "rank" BIGINT, "node" VARCHAR NOT NULL, "records" BIGINT, "steps" BIGINT, "t0" TIMESTAMP, "first_ts" TIMESTAMP, "last_ts" TIMESTAMP, "wait_weighted" DOUBLE, "step_weighted_waited" DOUBLE, "wait_records" BIGINT, "stepping_records" BIGINT, "stepping_steps" BIGINT, "span_seconds" DOUBLE, "step_median" DOUBLE, "examples" DOUBLE);
CREATE TABLE step_rollup_5m ("bucket" TIMESTAMP NOT NULL, "job" VARCHAR, "run" VARCHAR, "rank" BIGINT, "node" VARCHAR NOT NULL, "records" BIGINT, "steps" BIGINT, "t0" TIMESTAMP, "first_ts" TIMESTAMP, "last_ts" TIMESTAMP, "wait_weighted" DOUBLE, "step_weighted_waited" DOUBLE, "wait_records" BIGINT, "stepping_records" BIGINT, "stepping_steps" BIGINT, "span_seconds" DOUBLE, "step_median" DOUBLE, "examples" DOUBLE);
DELETE FROM rollup_dirty;
INSERT INTO rollup_dirty (node, lo, hi, src) SELECT node, min(ts), max(ts), 'gpu_samples' FROM gpu_samples GROUP BY node;
INSERT INTO rollup_dirty (node, lo, hi, src) SELECT node, min(ts), max(ts), 'host_samples' FROM host_samples GROUP BY node;
INSERT INTO rollup_dirty (node, lo, hi, src) SELECT node, min(ts), max(ts), 'steps' FROM steps GROUP BY node;
