-- cmdare collector schema, migration 030 (issue 68): a data-parallel job's declaration carries
-- its GPUs per node (torchrun's LOCAL_WORLD_SIZE) and the gradient bytes it all-reduces per
-- step, beside its world size: what comm_bound's evidence and the all-reduce advice read.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS gpus_per_node BIGINT;
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS grad_bytes BIGINT;
