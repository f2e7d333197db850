-- cmdare collector schema, migration 004: VM identity, lifecycle and revocation notices
-- (agent source "cloud" and the agent's own lifecycle events), and the lives of instances.
-- Unix-second fields (boot_time, deadline) are kept as DOUBLE, as sent.

ALTER TABLE heartbeats ADD COLUMN interval_seconds DOUBLE;

-- What the cloud's metadata service (or, outside a cloud, the machine) says about the VM;
-- one row per agent start.
CREATE TABLE instance_identity (
    id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, job VARCHAR,
    cloud VARCHAR, region VARCHAR, zone VARCHAR, instance_id VARCHAR, instance_type VARCHAR,
    name VARCHAR, spot BOOLEAN, accelerator VARCHAR, accelerator_count BIGINT, boot_time DOUBLE
);

-- agent_start, agent_stop (clean: SIGTERM / SIGINT / end of --duration), boot (dated at the
-- boot), shutdown (the OS was going down when the agent was stopped).
CREATE TABLE lifecycle_events (
    id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, job VARCHAR,
    event VARCHAR, instance VARCHAR, boot_time DOUBLE, stop_reason VARCHAR, interval_seconds DOUBLE,
    agent_version VARCHAR, uptime_seconds DOUBLE
);

-- Notices from the cloud: ts = when the agent saw it; deadline = when the cloud acts.
CREATE TABLE revocations (
    id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, job VARCHAR,
    cloud VARCHAR, kind VARCHAR, action VARCHAR, deadline DOUBLE, lead_seconds DOUBLE,
    notice_id VARCHAR, revokes BOOLEAN, detail VARCHAR, boot_time DOUBLE
);

-- The lives of instances (the instance_lives table macro and the instances view) are
-- analytics/sql/instance_lives.sql and instances.sql, applied on every writable open.
