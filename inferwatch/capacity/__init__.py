"""Capacity planning: replicas and GPUs for a target load, from a roofline model of the engine."""
