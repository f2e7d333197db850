-- cmdare collector schema, migration 024 (issue 55): who the scheduler gave each GPU to, as
-- the agent found it: the Kubernetes pod (the kubelet's pod-resources API: namespace, pod,
-- container) or the Slurm job and its user. Stored packed in one JSON column (``sched``; the
-- view gpu_samples reads each field by name, as the MIG identity): a GPU no scheduler holds
-- stores NULL there. The GPU rollups keep the namespace, Slurm job and user, so goodput by
-- namespace, Slurm job or user reads no raw sample. Rows before this migration had none:
-- nothing to rebuild.
ALTER TABLE gpu_samples_packed ADD COLUMN IF NOT EXISTS "sched" JSON;
ALTER TABLE gpu_rollup_1m ADD COLUMN IF NOT EXISTS "namespace" VARCHAR;
ALTER TABLE gpu_rollup_1m ADD COLUMN IF NOT EXISTS "slurm_job" VARCHAR;
ALTER TABLE gpu_rollup_1m ADD COLUMN IF NOT EXISTS "slurm_user" VARCHAR;
ALTER TABLE gpu_rollup_5m ADD COLUMN IF NOT EXISTS "namespace" VARCHAR;
ALTER TABLE gpu_rollup_5m ADD COLUMN IF NOT EXISTS "slurm_job" VARCHAR;
ALTER TABLE gpu_rollup_5m ADD COLUMN IF NOT EXISTS "slurm_user" VARCHAR;
