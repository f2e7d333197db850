-- cmdare collector schema, migration 023: the earliest interval start per step rollup row as
-- goodput's sweep times it (collector/rollup.py ``start_min``), so fleet goodput reads each
-- run's first instant from the rollup; the step rollups are rebuilt (every node's steps
-- pending: reads stay exact meanwhile, from the raw rows).
ALTER TABLE step_rollup_1m ADD COLUMN IF NOT EXISTS "start_min" DOUBLE;
ALTER TABLE step_rollup_5m ADD COLUMN IF NOT EXISTS "start_min" DOUBLE;
DELETE FROM rollup_dirty WHERE src = 'steps';
INSERT INTO rollup_dirty (node, lo, hi, src) SELECT node, min(ts), max(ts), 'steps' FROM steps GROUP BY node;
