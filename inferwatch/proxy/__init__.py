"""Tenancy proxy: a streaming reverse proxy that meters tokens and cost per tenant.

It sits in front of one OpenAI-compatible engine, resolves who is calling, admits or rejects
the request before it reaches the GPU, forwards it, and charges the tokens the engine reports
(or, failing that, an estimate labelled as such) to the tenant, model and version triple.
"""
