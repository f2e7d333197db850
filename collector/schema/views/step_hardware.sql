-- step_hardware: each step aggregate next to its node's hardware use over its interval.
-- Owned by cmdare.analytics (analytics/views.py applies it on every writable open).
--
-- Each step aggregate next to the same node's hardware over the same interval
-- (ts - interval_seconds .. ts): mean GPU and GPU-memory utilisation across its GPUs (on a
-- TPU VM: TensorCore duty cycle and HBM bandwidth use across its TPU cores) and
-- mean host CPU utilisation, over the samples taken in the interval.  An interval with no
-- sample in it (the first of a run, shorter than the agent's sampling interval, or one
-- whose last step ended just before the agent's tick) takes the node's next sampling tick
-- when that comes within interval_seconds after ts: NVML reports utilisation over the
-- period before each sample, so the next tick is the one that saw those steps.  NULL
-- where the node sent no such samples then, or the row has no interval_seconds.
--
-- The first form (in migration 002) ran a correlated range subquery per metric: 28 s on a
-- day of 20 nodes (173k step rows, 1.4M GPU samples), and no faster for one node.  This one sums
-- each node's samples per tick with running totals and reads a window's mean as the
-- difference of the totals at its two ends, found with ASOF joins (sort-merge): 0.4 s for
-- the same day, 0.03 s for one node (bench/step_hardware.py).
CREATE OR REPLACE VIEW step_hardware AS
WITH gt AS (
    SELECT node, ts, avg(util_gpu_ratio) AS u, avg(util_mem_ratio) AS m, sum(count(*)) OVER n AS k,
        sum(sum(util_gpu_ratio)) OVER n AS su, sum(count(util_gpu_ratio)) OVER n AS cu,
        sum(sum(util_mem_ratio)) OVER n AS sm, sum(count(util_mem_ratio)) OVER n AS cm
    FROM (SELECT node, ts, util_gpu_ratio, util_mem_ratio FROM gpu_samples
          UNION ALL  -- a TPU VM's accelerators: TensorCore duty cycle and HBM bandwidth use
          SELECT node, ts, duty_cycle_ratio, hbm_bandwidth_ratio FROM tpu_samples)
    GROUP BY node, ts
    WINDOW n AS (PARTITION BY node ORDER BY ts ROWS UNBOUNDED PRECEDING)),
ht AS (
    SELECT node, ts, avg(cpu_util_ratio) AS c, sum(count(*)) OVER n AS k,
        sum(sum(cpu_util_ratio)) OVER n AS sc, sum(count(cpu_util_ratio)) OVER n AS cc
    FROM host_samples GROUP BY node, ts
    WINDOW n AS (PARTITION BY node ORDER BY ts ROWS UNBOUNDED PRECEDING)),
w AS (
    SELECT *, ts - to_microseconds(CAST(coalesce(interval_seconds, 0) * 1e6 AS BIGINT)) AS _lo,
        ts + to_microseconds(CAST(coalesce(interval_seconds, 0) * 1e6 AS BIGINT)) AS _lim
    FROM steps)  -- no interval (a TensorBoard run's first point): an empty window, NULL
SELECT w.* EXCLUDE (_lo, _lim),
    CASE WHEN coalesce(g1.k, 0) > coalesce(g0.k, 0)
             THEN (g1.su - coalesce(g0.su, 0)) / nullif(g1.cu - coalesce(g0.cu, 0), 0)
         WHEN gn.ts <= w._lim THEN gn.u END AS gpu_util_ratio,
    CASE WHEN coalesce(g1.k, 0) > coalesce(g0.k, 0)
             THEN (g1.sm - coalesce(g0.sm, 0)) / nullif(g1.cm - coalesce(g0.cm, 0), 0)
         WHEN gn.ts <= w._lim THEN gn.m END AS gpu_mem_util_ratio,
    CASE WHEN coalesce(h1.k, 0) > coalesce(h0.k, 0)
             THEN (h1.sc - coalesce(h0.sc, 0)) / nullif(h1.cc - coalesce(h0.cc, 0), 0)
         WHEN hn.ts <= w._lim THEN hn.c END AS host_cpu_util_ratio
FROM w
    ASOF LEFT JOIN gt g0 ON g0.node = w.node AND g0.ts <= w._lo
    ASOF LEFT JOIN gt g1 ON g1.node = w.node AND g1.ts <= w.ts
    ASOF LEFT JOIN gt gn ON gn.node = w.node AND gn.ts > w.ts
    ASOF LEFT JOIN ht h0 ON h0.node = w.node AND h0.ts <= w._lo
    ASOF LEFT JOIN ht h1 ON h1.node = w.node AND h1.ts <= w.ts
    ASOF LEFT JOIN ht hn ON hn.node = w.node AND hn.ts > w.ts;
