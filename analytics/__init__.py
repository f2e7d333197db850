"""cmdare analytics: queries over the collector's DuckDB file (library; the CLI is a thin layer)."""
