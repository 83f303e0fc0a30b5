"""Prometheus alert and recording rules generated from the metric catalogue.

``config`` loads and validates the alert config, ``recording`` and one module per layer
(``latency`` with ``slo``, ``availability``, ``gpu``, ``cost``, ``quality``) build rules as
data (``model``) from catalogue keys (``promql``), ``build`` assembles the groups and
``writer`` renders the rule files and the PrometheusRule resource.
"""
