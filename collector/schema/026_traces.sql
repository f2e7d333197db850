-- cmdare collector schema, migration 026 (issue 68): PyTorch profiler (Kineto) traces imported
-- with `analyze import trace`, reduced to what `analyze trace` reads, HTA's way: each rank's
-- GPU kernels launched within the traced profiler steps (the last step, cut short by the
-- profiler's stop, left out), their times in whole microseconds of the trace's clock, their
-- kind (computation, communication, memory, other) and the profiler step that launched them;
-- and each rank's profiler steps. One import of a rank replaces that rank's rows of the job.
CREATE TABLE trace_ranks (
    job VARCHAR NOT NULL, rank INTEGER NOT NULL, world_size INTEGER, source VARCHAR, sha256 VARCHAR,
    kernels BIGINT, steps INTEGER, imported_at TIMESTAMP, PRIMARY KEY (job, rank)
);
CREATE TABLE trace_kernels (
    job VARCHAR NOT NULL, rank INTEGER NOT NULL, step INTEGER, ts BIGINT NOT NULL, dur BIGINT NOT NULL,
    kind VARCHAR NOT NULL, stream BIGINT
);
CREATE TABLE trace_steps (
    job VARCHAR NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL, ts BIGINT NOT NULL, dur BIGINT NOT NULL
);
