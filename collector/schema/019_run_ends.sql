-- cmdare collector schema, migration 019: how each training run ended (issue 51).  One row
-- per (job, run, rank) end: finished, failed, interrupted (as the process reported it with
-- cmdare.agent.track) or crashed (the agent saw the process gone without an end).  The
-- runs() macro (analytics) reads it; JobStalled / JobFailed / JobCrashed judge by it.
CREATE TABLE run_ends (
    id VARCHAR NOT NULL, ts TIMESTAMP NOT NULL, node VARCHAR NOT NULL, job VARCHAR,
    run VARCHAR, rank BIGINT, state VARCHAR, exit_code BIGINT, signal VARCHAR, error VARCHAR,
    steps BIGINT, pid BIGINT
);
