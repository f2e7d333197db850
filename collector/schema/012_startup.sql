-- VM start-up from what the VM and the cloud say: the agent's first start is "ready" only
-- when systemd was still booting the VM (during_boot); the cloud's own launch time where its
-- metadata has one (AWS pendingTime).
ALTER TABLE lifecycle_events ADD COLUMN during_boot BOOLEAN;
ALTER TABLE instance_identity ADD COLUMN launched_at DOUBLE;
