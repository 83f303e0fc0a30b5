"""Engine adapters: one module per engine maps its /metrics onto the catalogue."""
