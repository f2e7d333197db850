-- cmdare collector schema, migration 010: alerting state (cmdare.analytics.alerts).
-- One row per alert instance (a rule and a label set) that is pending, firing, inhibited or
-- recently resolved; the collector's rule evaluation writes it after each group's round and
-- reads it back when it starts, so a firing alert keeps its start time across restarts and
-- is not sent again as new.
CREATE TABLE alerts (
    rule         VARCHAR NOT NULL,   -- "<group>/<alert>"
    fingerprint  VARCHAR NOT NULL,   -- of the rule and the instance's labels
    labels       JSON NOT NULL,
    annotations  JSON,
    state        VARCHAR NOT NULL,   -- pending | firing | inhibited | resolved
    value        DOUBLE,
    active_at    TIMESTAMP NOT NULL, -- since when the condition holds (pending from here)
    fired_at     TIMESTAMP,          -- when it started firing (startsAt)
    last_seen    TIMESTAMP,          -- the last evaluation that found the condition true
    resolved_at  TIMESTAMP,          -- endsAt, once resolved
    last_sent    TIMESTAMP,          -- the last delivery to the receivers
    sent_resolved BOOLEAN NOT NULL DEFAULT false,
    inhibited_by VARCHAR,            -- what suppresses it (a revocation of node N at T)
    updated_at   TIMESTAMP NOT NULL,
    PRIMARY KEY (rule, fingerprint)
);

-- Each loaded rule's health: the last evaluation's outcome and how long it took.
CREATE TABLE alert_rules (
    rule         VARCHAR PRIMARY KEY,
    group_name   VARCHAR NOT NULL,
    file         VARCHAR,
    health       VARCHAR NOT NULL,   -- ok | error | unknown (not evaluated yet)
    last_error   VARCHAR,
    last_eval    TIMESTAMP,
    eval_seconds DOUBLE,
    instances    INTEGER
);
