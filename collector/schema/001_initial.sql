-- cmdare collector schema, migration 001: the walking skeleton's tables.
-- All timestamps are UTC (TIMESTAMP, microseconds).  Every telemetry table starts with the
-- envelope columns id (fleet-unique, de-duplicated on), ts, node, job.

CREATE TABLE nodes (
    node        VARCHAR PRIMARY KEY,
    role        VARCHAR,
    job         VARCHAR,
    labels      JSON,
    first_seen  TIMESTAMP,
    last_seen   TIMESTAMP
);

CREATE TABLE host_samples (
    id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, job VARCHAR,
    cpu_util_ratio DOUBLE, cpu_per_core_ratio DOUBLE[],
    load1 DOUBLE, load5 DOUBLE, load15 DOUBLE,
    mem_total_bytes BIGINT, mem_used_bytes BIGINT, mem_available_bytes BIGINT,
    swap_total_bytes BIGINT, swap_used_bytes BIGINT,
    net JSON, disk JSON, procs BIGINT
);

CREATE TABLE gpu_samples (
    id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, job VARCHAR,
    "index" BIGINT, uuid VARCHAR, name VARCHAR,
    util_gpu_ratio DOUBLE, util_mem_ratio DOUBLE, mem_used_bytes BIGINT, mem_total_bytes BIGINT,
    power_watts DOUBLE, power_limit_watts DOUBLE, temp_celsius DOUBLE,
    sm_clock_hz DOUBLE, mem_clock_hz DOUBLE,
    pcie_tx_bytes_per_second DOUBLE, pcie_rx_bytes_per_second DOUBLE,
    throttle_mask BIGINT, throttle_reasons VARCHAR[],
    ecc_corrected_total BIGINT, ecc_uncorrected_total BIGINT, processes JSON
);

CREATE TABLE gpu_events (
    id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, job VARCHAR,
    "index" BIGINT, uuid VARCHAR, kind VARCHAR, count BIGINT, xid BIGINT
);

CREATE TABLE heartbeats (
    id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, job VARCHAR,
    seq BIGINT, instance VARCHAR, agent_version VARCHAR, uptime_seconds DOUBLE,
    samples_total BIGINT, events_total BIGINT, spooled_total BIGINT, shipped_total BIGINT,
    dropped_total BIGINT, spool_bytes BIGINT, spool_pending BIGINT
);

CREATE TABLE agent_status (
    id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, job VARCHAR,
    source VARCHAR, ok BOOLEAN, state VARCHAR, duration_seconds DOUBLE, message VARCHAR
);

-- Events of a type this collector does not know yet (a newer agent): kept whole.
CREATE TABLE unknown_events (
    id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, job VARCHAR,
    type VARCHAR, data JSON
);

-- What could not be parsed or failed validation, with the reason and the raw bytes
-- (capped; raw_bytes is the original size).  origin names where it came from.
CREATE TABLE dead_letters (
    received_at TIMESTAMP NOT NULL,
    origin      VARCHAR NOT NULL,   -- kafka:<topic>/<partition>@<offset> or spool:<dir>/<segment>@<offset>
    line        BIGINT NOT NULL,    -- 1-based line within the message (0: the whole message)
    reason      VARCHAR NOT NULL,
    raw         BLOB,
    raw_bytes   BIGINT
);

-- How far a spool directory has been loaded (committed with the rows it covers).
CREATE TABLE ingest_positions (
    source      VARCHAR PRIMARY KEY,
    segment     BIGINT NOT NULL,
    "offset"    BIGINT NOT NULL,
    updated_at  TIMESTAMP NOT NULL
);
