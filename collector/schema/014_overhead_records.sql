-- Overhead records imported from CSV (analyze import checkpoints|startups): checkpoint saves
-- and cloud VM start-ups in the cloud's phases. id: a hash of the values and of how many
-- identical rows came before in the file, so importing a file again stores nothing twice.
CREATE TABLE checkpoint_records (
    id VARCHAR PRIMARY KEY, model VARCHAR, size_mb DOUBLE NOT NULL, save_s DOUBLE NOT NULL,
    weight_mb DOUBLE, meta_mb DOUBLE, index_mb DOUBLE, graph_mb DOUBLE, tensors BIGINT, params BIGINT,
    local_write_s DOUBLE, source VARCHAR, line INTEGER, imported_at TIMESTAMP
);
CREATE TABLE startup_records (
    id VARCHAR PRIMARY KEY, region VARCHAR NOT NULL, purchase VARCHAR NOT NULL, gpu_type VARCHAR NOT NULL,
    provisioning_s DOUBLE NOT NULL, staging_s DOUBLE NOT NULL, booting_s DOUBLE NOT NULL,
    source VARCHAR, line INTEGER, imported_at TIMESTAMP
);
