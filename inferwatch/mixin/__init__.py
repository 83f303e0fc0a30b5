"""The generator kit every generator reads: the alert config and its schema, the PromQL vocabulary
built from catalogue keys, the rule model and the recording rules (what kubernetes-mixin's
``config.libsonnet`` is to its dashboards and alerts)."""
