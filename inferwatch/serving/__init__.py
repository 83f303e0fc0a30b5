"""The HTTP and exposition plumbing every server shares: the Prometheus text format, histograms,
the /metrics, /healthz and /readyz answers, readiness conditions and bounded page reads."""
