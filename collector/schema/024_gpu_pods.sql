-- cmdare collector schema, migration 024 (issue 55): the Kubernetes pod the kubelet gave
-- each GPU to, as the agent's pod-resources lookup found it. Stored packed in one JSON
-- column (``k8s``: namespace, pod, container; the view gpu_samples reads each by name, as
-- the MIG identity): a GPU outside Kubernetes stores NULL there. The GPU rollups keep the
-- namespace, so goodput by namespace reads no raw sample. Rows before this migration had
-- no pod: nothing to rebuild.
ALTER TABLE gpu_samples_packed ADD COLUMN IF NOT EXISTS "k8s" JSON;
ALTER TABLE gpu_rollup_1m ADD COLUMN IF NOT EXISTS "namespace" VARCHAR;
ALTER TABLE gpu_rollup_5m ADD COLUMN IF NOT EXISTS "namespace" VARCHAR;
