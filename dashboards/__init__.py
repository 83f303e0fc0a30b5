"""Grafana dashboards generated from the metric catalogue."""
