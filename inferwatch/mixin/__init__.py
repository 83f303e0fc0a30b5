"""The generator kit every generator reads: the config loader with the defaults components share
(an alert's own settings live beside its rule, in the alerts component), the PromQL vocabulary
built from catalogue keys, the rule model and the recording rules (what kubernetes-mixin's
``config.libsonnet`` is to its dashboards and alerts)."""
