"""Runbook actions: one module each, all implementing :class:`base.Action`."""
