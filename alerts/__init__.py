"""Prometheus alert and recording rules generated from the metric catalogue.

``config`` loads the alert config: the shared defaults and each layer's own ``SETTINGS``,
declared beside its rules. One module per layer (``latency`` with ``slo``, ``availability``,
``gpu``, ``cost``, ``quality``) builds rules as data from catalogue keys, ``build`` assembles
the groups with the shared recording rules, ``writer`` renders the rule files and the
PrometheusRule resource, and ``alertmanager`` the routing for them (its settings in
``routing``).
"""
