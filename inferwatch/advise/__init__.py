"""``inferwatch advise``: engine settings and a replica count for a model, from its live data."""
