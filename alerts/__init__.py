"""Prometheus alert rules generated from the metric catalogue."""
