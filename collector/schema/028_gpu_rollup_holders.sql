-- cmdare collector schema, migration 028 (issue 64): the GPU rollups keep the pod, the MIG
-- profile and the job of the samples a scheduler held the GPU for, so `analyze gpu` over a
-- whole window reads the 5-minute rollup (2.3 M rows for a 1,000-node day) instead of every
-- sample (69 M), with the same answer. The GPU rollups are rebuilt from the raw samples
-- still held (every node's GPU samples pending: reads stay exact meanwhile); buckets whose
-- raw samples are gone keep none.
ALTER TABLE gpu_rollup_1m ADD COLUMN IF NOT EXISTS "pod" VARCHAR;
ALTER TABLE gpu_rollup_1m ADD COLUMN IF NOT EXISTS "mig_profile" VARCHAR;
ALTER TABLE gpu_rollup_1m ADD COLUMN IF NOT EXISTS "held_job" VARCHAR;
ALTER TABLE gpu_rollup_5m ADD COLUMN IF NOT EXISTS "pod" VARCHAR;
ALTER TABLE gpu_rollup_5m ADD COLUMN IF NOT EXISTS "mig_profile" VARCHAR;
ALTER TABLE gpu_rollup_5m ADD COLUMN IF NOT EXISTS "held_job" VARCHAR;
DELETE FROM rollup_dirty WHERE src = 'gpu_samples';
INSERT INTO rollup_dirty (node, lo, hi, src) SELECT node, min(ts), max(ts), 'gpu_samples' FROM gpu_samples_packed GROUP BY node;
