"""Sidecar exporters: engine scrapes, GPU telemetry and tenant metering, in one schema."""
