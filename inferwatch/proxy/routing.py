"""Which handler serves a request, and the guard every handler runs in.

The route (see :mod:`routes`) picks the handler: metered, passed through, the proxy's own
``/healthz`` and ``/readyz``, or a refusal that says why the route is not served. The guard
gives each request its :class:`Exchange`, turns a client that goes away into cancellation,
and always hands the finished exchange to accounting, whatever happened to it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from inferwatch.proxy.admission import Refusal
from inferwatch.proxy.exchange import ClientGone, Exchange, Receive, Scope, Send
from inferwatch.proxy.routes import BadTarget, Route, Router

#: a request handler, given the request's exchange and route
Handler = Callable[[Exchange, Route, Scope, Receive, Send], Awaitable[None]]


class Routing:
    def __init__(
        self,
        router: Router,
        *,
        metered: Handler,
        passthrough: Handler,
        own: Callable[[Route, Send], Awaitable[None]],
        refuse: Callable[[Exchange, Send, Refusal], Awaitable[None]],
        finish: Callable[[Exchange], None],
        handlers: set[asyncio.Task[Any]],
    ) -> None:
        """``own`` serves the proxy's own routes (not guarded: no exchange, no access log);
        ``finish`` gets every guarded exchange at its end; ``handlers`` holds the tasks of
        the requests in flight (a shutdown waits for them to charge their tokens)."""
        self.router = router
        self.metered = metered
        self.passthrough = passthrough
        self.own = own
        self.refuse = refuse
        self.finish = finish
        self.handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            route = self.router.route(scope["method"], scope["raw_path"], scope["query_string"])
        except BadTarget as exc:
            refusal = Refusal(400, "rejected_bad_request", str(exc))
            bad = Route("refused", scope["method"], str(scope["path"])[:256], b"")
            return await self.guarded(self._refusing(refusal), bad, scope, receive, send)
        if route.kind == "metered":
            await self.guarded(self.metered, route, scope, receive, send)
        elif route.kind == "passthrough":
            await self.guarded(self.passthrough, route, scope, receive, send)
        elif route.kind == "own":
            await self.own(route, send)
        else:
            refusal = route_refusal(route)
            await self.guarded(self._refusing(refusal), route, scope, receive, send)

    def _refusing(self, refusal: Refusal) -> Handler:
        async def refuse(
            exchange: Exchange, route: Route, scope: Scope, receive: Receive, send: Send
        ) -> None:
            await self.refuse(exchange, send, refusal)

        return refuse

    async def guarded(
        self, handler: Handler, route: Route, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Run a handler; turn a client disconnect into cancellation, and always log."""
        exchange = Exchange(start=time.perf_counter(), path=route.path)
        task = asyncio.current_task()
        if task is not None:
            self.handlers.add(task)
        try:
            await handler(exchange, route, scope, receive, send)
        except ClientGone:
            exchange.outcome = exchange.outcome or "client_cancelled"
        finally:
            if task is not None:
                self.handlers.discard(task)
            self.finish(exchange)


def route_refusal(route: Route) -> Refusal:
    """Why a route that is neither metered nor passed through is refused."""
    where = f"{route.method} {route.path}"
    if route.kind == "unmetered":
        return Refusal(
            403,
            "rejected_route",
            f"{where} makes the engine generate or embed tokens in a form this proxy does "
            "not meter (it meters POST /v1/chat/completions, /v1/completions and "
            "/v1/embeddings)",
        )
    return Refusal(
        404,
        "rejected_route",
        f"{where} is not a route this proxy meters or passes through "
        "(see routes.passthrough in its config)",
    )
