-- runs(asof_ts, horizon, since, lost_after): every training process's run and how it stands.
-- Owned by cmdare.analytics (collector/views.py applies it on every writable open).
--
-- One row per (job, run, rank): its node (the latest it reported from), role and pid, when
-- it was first seen and last stepped, the steps it reported, and its state:
--   finished | failed | interrupted  the process said so (cmdare.agent.track);
--   crashed                          the agent saw its process gone without an end;
--   running                          no end, and its node is alive (or not watched by an agent);
--   node lost | node revoked | node stopped
--                                    no end, and its node's life ended (a crash or kill of the
--                                    VM, a revocation, the agent stopped) before one came.
-- An end counts only when it is at or after the rank's last step or declaration: a process
-- restarted under the same (job, run, rank) runs again; of two ends at one time, the
-- process's own beats the agent's crashed verdict.
-- Rows after asof_ts and before since (default: all) are left out (a rank with no row in
-- that window is not listed; its end counts when it falls in the window); nodes are judged alive as of horizon
-- (default asof_ts), the collector's ingest horizon in alert rules: silence the collector
-- has not caught up with never ends a run.
CREATE OR REPLACE MACRO runs(asof_ts := NULL, horizon := NULL, since := NULL, lost_after := 3) AS TABLE
WITH lim AS (SELECT coalesce(asof_ts, 'infinity'::TIMESTAMP) AS t, coalesce(since, '-infinity'::TIMESTAMP) AS s),
act AS (
    SELECT job, coalesce(run, '') AS run, coalesce(rank, 0) AS rank, node, ts, steps, NULL AS role, NULL AS pid
    FROM steps WHERE job IS NOT NULL AND ts BETWEEN (SELECT s FROM lim) AND (SELECT t FROM lim)
    UNION ALL
    SELECT job, coalesce(run, ''), coalesce(rank, 0), node, ts, 0, role, pid
    FROM jobs WHERE job IS NOT NULL AND ts BETWEEN (SELECT s FROM lim) AND (SELECT t FROM lim)),
ranks AS (
    SELECT job, run, rank, arg_max(node, ts) AS node, min(ts) AS first_seen, max(ts) AS last_seen,
           max(ts) FILTER (WHERE steps > 0) AS last_step_at, sum(steps) AS steps,
           arg_max(role, ts) FILTER (WHERE role IS NOT NULL) AS role,
           arg_max(pid, ts) FILTER (WHERE pid IS NOT NULL) AS pid
    FROM act GROUP BY ALL),
ends AS (
    SELECT job, coalesce(run, '') AS run, coalesce(rank, 0) AS rank, ts AS ended_at, node, state, exit_code,
           signal, error, pid, steps
    FROM run_ends WHERE job IS NOT NULL AND ts BETWEEN (SELECT s FROM lim) AND (SELECT t FROM lim)
    QUALIFY row_number() OVER (PARTITION BY job, coalesce(run, ''), coalesce(rank, 0)
                               ORDER BY ended_at DESC, state = 'crashed') = 1),
r AS (
    SELECT coalesce(k.job, s.job) AS job, coalesce(k.run, s.run) AS run, coalesce(k.rank, s.rank) AS rank,
           coalesce(k.node, s.node) AS node, k.role, coalesce(s.pid, k.pid) AS pid,
           coalesce(k.first_seen, s.ended_at) AS first_seen, k.last_step_at,
           coalesce(k.steps, 0) AS steps,
           CASE WHEN s.ended_at IS NOT NULL AND (k.last_seen IS NULL OR s.ended_at >= k.last_seen) THEN s.state END
               AS ended_state,
           CASE WHEN s.ended_at IS NOT NULL AND (k.last_seen IS NULL OR s.ended_at >= k.last_seen) THEN s.ended_at END
               AS ended_at,
           s.exit_code, s.signal, s.error
    FROM ranks k FULL OUTER JOIN ends s ON k.job = s.job AND k.run = s.run AND k.rank = s.rank),
life AS (
    SELECT node, state AS node_state, end_reason, ended_at AS node_ended_at
    FROM instance_lives(lost_after := lost_after, asof_ts := coalesce(horizon, asof_ts))
    WHERE boot_time <= (SELECT t FROM lim)
    QUALIFY row_number() OVER (PARTITION BY node ORDER BY boot_time DESC) = 1)
SELECT r.job, r.run, r.rank, r.node, r.role, r.pid,
       CASE WHEN r.ended_state IS NOT NULL THEN r.ended_state
            WHEN l.node_state = 'ended' THEN 'node ' || l.end_reason
            ELSE 'running' END AS state,
       coalesce(r.ended_at, CASE WHEN l.node_state = 'ended' THEN l.node_ended_at END) AS ended_at,
       r.first_seen, r.last_step_at, r.steps,
       CASE WHEN r.ended_state IS NOT NULL THEN r.exit_code END AS exit_code,
       CASE WHEN r.ended_state IS NOT NULL THEN r.signal END AS signal,
       CASE WHEN r.ended_state IS NOT NULL THEN r.error END AS error
FROM r LEFT JOIN life l USING (node);
