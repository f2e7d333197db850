-- cmdare collector schema, migration 025 (issue 66): the host rollups keep each bucket's
-- network and disk counters (summed over NICs and disks, at its first and last sample), so
-- `analyze host --every` shows the same MB/s after --retain-raw deleted the raw samples as
-- before. The host rollups are rebuilt from the raw samples still held (every node's host
-- samples pending: reads stay exact meanwhile); buckets whose raw samples are gone keep none.
ALTER TABLE host_rollup_1m ADD COLUMN IF NOT EXISTS "net_rx_first" DOUBLE;
ALTER TABLE host_rollup_1m ADD COLUMN IF NOT EXISTS "net_rx_last" DOUBLE;
ALTER TABLE host_rollup_1m ADD COLUMN IF NOT EXISTS "net_tx_first" DOUBLE;
ALTER TABLE host_rollup_1m ADD COLUMN IF NOT EXISTS "net_tx_last" DOUBLE;
ALTER TABLE host_rollup_1m ADD COLUMN IF NOT EXISTS "disk_read_first" DOUBLE;
ALTER TABLE host_rollup_1m ADD COLUMN IF NOT EXISTS "disk_read_last" DOUBLE;
ALTER TABLE host_rollup_1m ADD COLUMN IF NOT EXISTS "disk_write_first" DOUBLE;
ALTER TABLE host_rollup_1m ADD COLUMN IF NOT EXISTS "disk_write_last" DOUBLE;
ALTER TABLE host_rollup_5m ADD COLUMN IF NOT EXISTS "net_rx_first" DOUBLE;
ALTER TABLE host_rollup_5m ADD COLUMN IF NOT EXISTS "net_rx_last" DOUBLE;
ALTER TABLE host_rollup_5m ADD COLUMN IF NOT EXISTS "net_tx_first" DOUBLE;
ALTER TABLE host_rollup_5m ADD COLUMN IF NOT EXISTS "net_tx_last" DOUBLE;
ALTER TABLE host_rollup_5m ADD COLUMN IF NOT EXISTS "disk_read_first" DOUBLE;
ALTER TABLE host_rollup_5m ADD COLUMN IF NOT EXISTS "disk_read_last" DOUBLE;
ALTER TABLE host_rollup_5m ADD COLUMN IF NOT EXISTS "disk_write_first" DOUBLE;
ALTER TABLE host_rollup_5m ADD COLUMN IF NOT EXISTS "disk_write_last" DOUBLE;
DELETE FROM rollup_dirty WHERE src = 'host_samples';
INSERT INTO rollup_dirty (node, lo, hi, src) SELECT node, min(ts), max(ts), 'host_samples' FROM host_samples GROUP BY node;
