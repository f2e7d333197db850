"""Agent sinks: the local spool (write-ahead log, always on) and Kafka."""
