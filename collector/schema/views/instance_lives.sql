-- instance_lives(lost_after, asof_ts): the lives of VMs, and how each ended.
-- Owned by cmdare.analytics (analytics/views.py applies it on every writable open).
--
-- One row per life of a VM (a node between one boot and the next): identity, first and last
-- seen, and how the life ended.  A life ends when the agent stopped cleanly and did not come
-- back in the same boot, when the node booted again, or when its heartbeats stopped for more
-- than lost_after sampling intervals (as of asof_ts, default now).  end_reason: revoked (a
-- notice that takes the VM away was seen in that life), stopped (a clean stop), lost
-- (neither: a crash, a kill, a power cut).  A life without an end is alive.
--
-- launched_at (the cloud's launch time, where its metadata gives one) and ready_at (the
-- agent's first start in the life when the boot started it) measure VM start-up.
--
-- An event belongs to the life it falls in: [boot, next boot). A range join on the node, not
-- an ASOF join: an ASOF join sorts every heartbeat (3.5 s for 14 M rows), the range join
-- hashes the few lives (0.19 s).
--
-- Events listed in clock_skew (stamped far from the collector's clock) are left out: a
-- clock years off would date a stop before its boot, or stretch a life over years.
CREATE OR REPLACE MACRO instance_lives(lost_after := 3, asof_ts := NULL) AS TABLE
WITH lifecycle_ok AS (SELECT * FROM lifecycle_events ANTI JOIN clock_skew ON clock_skew.id = lifecycle_events.id),
heartbeats_ok AS (SELECT * FROM heartbeats ANTI JOIN clock_skew ON clock_skew.id = heartbeats.id),
revocations_ok AS (SELECT * FROM revocations ANTI JOIN clock_skew ON clock_skew.id = revocations.id),
identity_ok AS (SELECT * FROM instance_identity ANTI JOIN clock_skew ON clock_skew.id = instance_identity.id),
starts AS (
    SELECT node, round(boot_time) AS boot, min(ts) AS first_start,
           arg_max(interval_seconds, ts) AS interval_seconds, arg_min(during_boot, ts) AS first_during_boot
    FROM lifecycle_ok WHERE event = 'agent_start' AND boot_time IS NOT NULL
    GROUP BY node, round(boot_time)),
lives AS (
    SELECT node, boot, make_timestamp(CAST(boot * 1e6 AS BIGINT)) AS booted, first_start, first_during_boot,
           coalesce(interval_seconds, 10) AS interval_seconds,
           lead(make_timestamp(CAST(boot * 1e6 AS BIGINT))) OVER (PARTITION BY node ORDER BY boot) AS next_boot
    FROM starts),
hb AS (
    SELECT l.node, l.boot, max(h.ts) AS last_hb
    FROM heartbeats_ok h JOIN lives l ON h.node = l.node AND h.ts >= l.booted AND (l.next_boot IS NULL OR h.ts < l.next_boot)
    GROUP BY ALL),
lc AS (
    SELECT l.node, l.boot, arg_max(e.event, e.ts) AS last_event, max(e.ts) AS last_lc,
           max(e.ts) FILTER (WHERE e.event IN ('agent_stop', 'shutdown')) AS stopped_at
    FROM lifecycle_ok e JOIN lives l ON e.node = l.node AND e.ts >= l.booted AND (l.next_boot IS NULL OR e.ts < l.next_boot)
    WHERE e.event <> 'boot'
    GROUP BY ALL),
rv AS (
    SELECT l.node, l.boot, count(*) AS notices, coalesce(bool_or(r.revokes), false) AS revoked,
           min(r.ts) FILTER (WHERE r.revokes) AS revoked_notice_at
    FROM revocations_ok r JOIN lives l ON r.node = l.node AND r.ts >= l.booted AND (l.next_boot IS NULL OR r.ts < l.next_boot)
    GROUP BY ALL),
id AS (
    SELECT l.node, l.boot, arg_max(i.cloud, i.ts) AS cloud, arg_max(i.region, i.ts) AS region,
           arg_max(i.zone, i.ts) AS zone, arg_max(i.instance_id, i.ts) AS instance_id,
           arg_max(i.instance_type, i.ts) AS instance_type, arg_max(i.spot, i.ts) AS spot,
           arg_max(i.accelerator, i.ts) AS accelerator, arg_max(i.accelerator_count, i.ts) AS accelerator_count,
           arg_max(i.launched_at, i.ts) AS launched_at
    FROM identity_ok i JOIN lives l ON i.node = l.node AND i.ts >= l.booted AND (l.next_boot IS NULL OR i.ts < l.next_boot)
    GROUP BY ALL),
j AS (
    SELECT l.*, id.cloud, id.region, id.zone, id.instance_id, id.instance_type, id.spot, id.accelerator,
           id.accelerator_count, id.launched_at, coalesce(rv.notices, 0) AS notices, coalesce(rv.revoked, false) AS revoked,
           rv.revoked_notice_at, lc.last_event, lc.stopped_at,
           greatest(hb.last_hb, lc.last_lc) AS last_seen,
           lc.last_event IN ('agent_stop', 'shutdown') AND (hb.last_hb IS NULL OR hb.last_hb <= lc.stopped_at)
               AS clean_stop,
           coalesce(asof_ts, make_timestamp(epoch_us(now()))) AS as_of
    FROM lives l LEFT JOIN hb USING (node, boot) LEFT JOIN lc USING (node, boot)
    LEFT JOIN rv USING (node, boot) LEFT JOIN id USING (node, boot)),
e AS (
    SELECT *, clean_stop OR next_boot IS NOT NULL
              OR last_seen < as_of - to_microseconds(CAST(lost_after * interval_seconds * 1e6 AS BIGINT)) AS ended
    FROM j)
SELECT node, instance_id, cloud, region, zone, instance_type, spot, accelerator, accelerator_count,
       booted AS boot_time, first_start AS first_seen, last_seen,
       CASE WHEN ended THEN 'ended' ELSE 'alive' END AS state,
       CASE WHEN NOT ended THEN NULL WHEN revoked THEN 'revoked' WHEN clean_stop THEN 'stopped' ELSE 'lost' END
           AS end_reason,
       CASE WHEN NOT ended THEN NULL WHEN clean_stop THEN stopped_at ELSE last_seen END AS ended_at,
       round(epoch(CASE WHEN ended AND clean_stop THEN stopped_at ELSE last_seen END - booted), 3)
           AS lifetime_seconds,
       notices, revoked_notice_at, interval_seconds,
       -- VM start-up as the VM and the cloud say it: launched (the cloud's own time, where its
       -- metadata has one), booted, ready (the agent's first start, only when systemd was still
       -- booting: an agent started by hand later says nothing about start-up)
       CASE WHEN launched_at IS NOT NULL AND isfinite(launched_at) AND launched_at BETWEEN 0 AND 1e11
            THEN make_timestamp(CAST(launched_at * 1e6 AS BIGINT)) END AS launched_at,
       CASE WHEN first_during_boot THEN first_start END AS ready_at
FROM e;
