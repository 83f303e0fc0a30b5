"""The gateway in front of a fleet: its HAProxy config, written from the fleet's topology and
checked against the grammar HAProxy reads."""
