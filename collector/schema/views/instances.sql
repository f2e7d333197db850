-- The lives with the default liveness rule (lost after 3 silent sampling intervals, now).
CREATE OR REPLACE VIEW instances AS SELECT * FROM instance_lives();
