-- cmdare collector schema, migration 021: spot VM lives imported from records a team already
-- has (analyze import lives: CM-DARE's measured lives, or a cloud's instance logs). One row a
-- VM life as the file gave it; lifetime_seconds is the life's length as the fit reads it
-- (lifetime_s, or ended - created, a running VM censored at the file's time). ended_by:
-- preempted (a revocation), max_lifetime (the provider's cap: censored), deleted (by its
-- owner: censored), running (still alive: censored). id: a hash of the values as given and
-- of how many identical rows came before in the file (importing a file again stores nothing
-- twice); a VM exported again in a later state is a second row, and readers take each VM's
-- final state (spot_lives_latest in analytics/imports/lives.py).
CREATE TABLE spot_lives (
    id VARCHAR PRIMARY KEY, vm VARCHAR, accelerator VARCHAR NOT NULL, region VARCHAR NOT NULL, zone VARCHAR,
    instance_type VARCHAR, purchase VARCHAR NOT NULL, lifetime_s DOUBLE, created TIMESTAMP, ended TIMESTAMP,
    ended_by VARCHAR NOT NULL, lifetime_seconds DOUBLE NOT NULL,
    source VARCHAR, line INTEGER, imported_at TIMESTAMP
);
