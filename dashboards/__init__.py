"""cmdare's pages: the fleet, a job, findings, alerts and models in a browser, served by the
collector at ``/ui`` over the HTTP API (no second data path), and Grafana dashboards for the
Prometheus path (``dashboards/grafana/``). See dashboards/README.md."""
