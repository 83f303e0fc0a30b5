"""The uvicorn settings the proxy is served with, shared by the CLI and the tests."""

from __future__ import annotations

import uvicorn

from inferwatch.exporters.tenancy.app import ProxyApp


def uvicorn_config(app: ProxyApp, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="auto",  # uvloop when installed
        http="auto",  # httptools when installed
        lifespan="on",
        access_log=False,  # the proxy writes its own, with tenant and tokens
        log_config=None,
        server_header=False,
        date_header=False,
        # The tenant header is trusted by the address of the TCP peer. uvicorn would otherwise
        # replace that address with one from X-Forwarded-For when the peer is local, and any
        # process in the pod could then pass as a trusted gateway and bill another tenant.
        proxy_headers=False,
    )
