"""Runbooks and the automation that acts on alerts."""
