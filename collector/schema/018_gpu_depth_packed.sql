-- GPU depth stored packed (issue 38): 017's 23 columns cost every GPU sample's insert
-- (DuckDB appends and logs every column, NULL or not: ingest 364k -> 254k samples/s).  Rows
-- are stored in gpu_samples_packed: the GPM metrics in one list (``gpm``), memory and link
-- health counters in another (``health``), a MIG instance's identity in one JSON object
-- (``mig``).  ``gpu_samples`` becomes a view giving every field its name back, so queries
-- read them as before: made after the migrations (collector.db.migrate) from
-- collector/ingest/storage.py, the one definition.  Rows are kept as they were.
CREATE TABLE gpu_samples_packed (
    "id" VARCHAR NOT NULL,
    "ts" TIMESTAMP NOT NULL,
    "node" VARCHAR NOT NULL,
    "job" VARCHAR,
    "index" BIGINT,
    "uuid" VARCHAR,
    "name" VARCHAR,
    "util_gpu_ratio" DOUBLE,
    "util_mem_ratio" DOUBLE,
    "mem_used_bytes" BIGINT,
    "mem_total_bytes" BIGINT,
    "power_watts" DOUBLE,
    "power_limit_watts" DOUBLE,
    "temp_celsius" DOUBLE,
    "sm_clock_hz" DOUBLE,
    "mem_clock_hz" DOUBLE,
    "pcie_tx_bytes_per_second" DOUBLE,
    "pcie_rx_bytes_per_second" DOUBLE,
    "throttle_mask" BIGINT,
    "throttle_reasons" VARCHAR[],
    "ecc_corrected_total" BIGINT,
    "ecc_uncorrected_total" BIGINT,
    "processes" JSON,
    "energy_joules_total" DOUBLE,
    "nvlink" JSON,
    "gpm" DOUBLE[],
    "health" BIGINT[],
    "mig" JSON
);
INSERT INTO gpu_samples_packed (id, ts, node, job, "index", "uuid", "name", "util_gpu_ratio", "util_mem_ratio", "mem_used_bytes", "mem_total_bytes", "power_watts", "power_limit_watts", "temp_celsius", "sm_clock_hz", "mem_clock_hz", "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second", "throttle_mask", "throttle_reasons", "ecc_corrected_total", "ecc_uncorrected_total", "processes", "energy_joules_total", "nvlink", "gpm", "health", "mig")
SELECT id, ts, node, job, "index", "uuid", "name", "util_gpu_ratio", "util_mem_ratio", "mem_used_bytes", "mem_total_bytes", "power_watts", "power_limit_watts", "temp_celsius", "sm_clock_hz", "mem_clock_hz", "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second", "throttle_mask", "throttle_reasons", "ecc_corrected_total", "ecc_uncorrected_total", "processes", "energy_joules_total", "nvlink", CASE WHEN "gr_engine_active_ratio" IS NOT NULL OR "sm_active_ratio" IS NOT NULL OR "sm_occupancy_ratio" IS NOT NULL OR "tensor_active_ratio" IS NOT NULL OR "fp16_active_ratio" IS NOT NULL OR "fp32_active_ratio" IS NOT NULL OR "fp64_active_ratio" IS NOT NULL OR "dram_active_ratio" IS NOT NULL OR "nvlink_total_rx_bytes_per_second" IS NOT NULL OR "nvlink_total_tx_bytes_per_second" IS NOT NULL THEN ["gr_engine_active_ratio", "sm_active_ratio", "sm_occupancy_ratio", "tensor_active_ratio", "fp16_active_ratio", "fp32_active_ratio", "fp64_active_ratio", "dram_active_ratio", "nvlink_total_rx_bytes_per_second", "nvlink_total_tx_bytes_per_second"]::DOUBLE[] END, CASE WHEN "remapped_rows_correctable" IS NOT NULL OR "remapped_rows_uncorrectable" IS NOT NULL OR "row_remap_pending" IS NOT NULL OR "row_remap_failed" IS NOT NULL OR "nvlink_errors_total" IS NOT NULL OR "retired_pages_sbe" IS NOT NULL OR "retired_pages_dbe" IS NOT NULL OR "retired_pages_pending" IS NOT NULL THEN ["remapped_rows_correctable", "remapped_rows_uncorrectable", CAST("row_remap_pending" AS BIGINT), CAST("row_remap_failed" AS BIGINT), "nvlink_errors_total", "retired_pages_sbe", "retired_pages_dbe", CAST("retired_pages_pending" AS BIGINT)]::BIGINT[] END, CAST(nullif('{' || concat_ws(',', '"parent_index":' || to_json("parent_index"), '"mig_profile":' || to_json("mig_profile"), '"gpu_instance_id":' || to_json("gpu_instance_id"), '"compute_instance_id":' || to_json("compute_instance_id"), '"mig_slice_ratio":' || to_json("mig_slice_ratio")) || '}', '{}') AS JSON)
FROM gpu_samples;
DROP TABLE gpu_samples;
