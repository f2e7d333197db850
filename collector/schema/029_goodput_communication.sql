-- cmdare collector schema, migration 029 (issue 68): goodput's `communication` category, the
-- share of step time data-parallel training waited on gradient communication computation
-- did not hide (steps.comm_mean_seconds, migration 027). Hours kept before it counted that
-- time as productive: their fingerprints carry no version, so they are read raw until the
-- writer computes them again (analytics/goodput/goodhours.py).
ALTER TABLE goodput_hours ADD COLUMN IF NOT EXISTS communication DOUBLE DEFAULT 0;
