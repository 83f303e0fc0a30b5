"""Grafana dashboards generated from the metric catalogue and the alert config.

``panels`` holds what every board shares, ``boards`` one module per board, ``writer`` the
files ``inferwatch generate dashboards`` writes, ``queries`` Grafana's variable substitution
and ``snapshot`` the PNG rendering of a board without Grafana.
"""

import warnings

with warnings.catch_warnings():
    # The SDK's classic and v2beta1 dashboard classes warn on import that a v2 model exists;
    # classic v1 JSON is what every Grafana from 10.4 imports, so it is the one emitted on purpose.
    warnings.simplefilter("ignore", DeprecationWarning)
    import grafana_foundation_sdk.builders.dashboard
    import grafana_foundation_sdk.builders.stat
    import grafana_foundation_sdk.builders.table
    import grafana_foundation_sdk.builders.timeseries
    import grafana_foundation_sdk.models.dashboard  # noqa: F401
