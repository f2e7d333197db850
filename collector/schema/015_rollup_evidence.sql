-- What the detectors' shared GPU buckets read (cmdare.analytics.detectors.evidence), kept in the
-- 5-minute rollup so that a fleet-wide analyze reads it instead of every sample: memory
-- used (sum and count) and the throttle reasons or-ed over the throttled samples.
-- The rollup is rebuilt: every node's samples are marked pending (reads stay exact).
ALTER TABLE gpu_rollup_5m ADD COLUMN mem_sum DOUBLE;
ALTER TABLE gpu_rollup_5m ADD COLUMN mem_samples BIGINT;
ALTER TABLE gpu_rollup_5m ADD COLUMN thr_mask BIGINT;
DELETE FROM rollup_dirty;
INSERT INTO rollup_dirty SELECT node, min(ts), max(ts) FROM gpu_samples GROUP BY node;
