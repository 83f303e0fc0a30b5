"""The gateway in front of a fleet: its HAProxy config, written from the fleet's topology."""
