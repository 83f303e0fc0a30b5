"""GPU telemetry: NVML, dcgm-exporter and recorded replays behind one interface."""
