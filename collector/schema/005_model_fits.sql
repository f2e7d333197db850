-- cmdare collector schema, migration 005: stored performance-model fits (analyze fit ...).
-- model holds everything a prediction needs (coefficients, covariance, residual scale,
-- survival curves), as JSON; predictions name the fit_id they used.
CREATE TABLE model_fits (
    fit_id      VARCHAR PRIMARY KEY,
    kind        VARCHAR NOT NULL,   -- speed | cluster | overhead | lifetime
    family      VARCHAR NOT NULL,   -- the model family that won on held-out error
    features    JSON,
    coefficients JSON,
    model       JSON NOT NULL,
    data_from   TIMESTAMP,          -- the telemetry window the fit used
    data_to     TIMESTAMP,
    rows        BIGINT NOT NULL,
    groups      BIGINT NOT NULL,    -- model architectures (speed, cluster, overhead) or lifetime groups
    cv_mape     DOUBLE,             -- held out (leave one group out), never training error
    cv_r2       DOUBLE,
    cv          JSON,               -- folds and per-family detail
    notes       JSON,
    fitted_at   TIMESTAMP NOT NULL
);
