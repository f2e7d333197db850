-- cmdare collector schema, migration 007: events stamped far from the collector's clock.
-- An event whose ts is further than the collector's --max-clock-skew (default 1 day) from
-- the time its batch was stored is stored as usual, and listed here with its skew
-- (ts - received_at, seconds; positive = the sender's clock is ahead).  Liveness and
-- lifetime verdicts (analytics/sql/instance_lives.sql) leave these events out;
-- analyze nodes shows each node's count and latest skew.
CREATE TABLE clock_skew (
    id           VARCHAR NOT NULL,
    ts           TIMESTAMP NOT NULL,
    node         VARCHAR NOT NULL,
    event_table  VARCHAR NOT NULL,
    received_at  TIMESTAMP NOT NULL,
    skew_seconds DOUBLE NOT NULL
);
