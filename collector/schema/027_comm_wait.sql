-- cmdare collector schema, migration 027 (issue 68): the communication wait a training step
-- reports beside its input wait (the tracking library's run.add_comm_wait, the adapters'
-- data-parallel hooks): mean seconds per step, and the share of step time, per interval.
ALTER TABLE steps ADD COLUMN IF NOT EXISTS comm_mean_seconds DOUBLE;
ALTER TABLE steps ADD COLUMN IF NOT EXISTS comm_share_ratio DOUBLE;
