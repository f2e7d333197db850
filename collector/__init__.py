"""cmdare-collector: loads telemetry events (Kafka topic or spool directory) into DuckDB."""
