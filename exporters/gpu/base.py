"""What every GPU telemetry backend shares: a bounded poll, the health metric and readiness.

Backends implement ``poll()``, a blocking read that returns filled catalogue families. This
base runs it on a daemon thread of its own, so that a stuck NVML call or a hung HTTP read
holds up neither the event loop nor the next scrape by more than ``timeout_s``, and at most
one poll is ever in flight. A failed or late poll serves the last good families while they
are younger than ``stale_s`` and says why in ``inferwatch_gpu_backend_error_info``.

A backend reads the GPUs its ``GpuScope`` covers (see ``scope``): their series are served
and their faults decide the ``gpu`` readiness condition; a node-wide scope never gates.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future

from prometheus_client.core import Metric

from inferwatch.exporters.gpu.families import FamilySet
from inferwatch.exporters.gpu.faults import FaultBook, fault_in
from inferwatch.exporters.gpu.scope import GpuScope, ScopeUnknown, Selection, covered
from inferwatch.logs import log_event
from inferwatch.serving.readiness import Condition

logger = logging.getLogger("inferwatch.gpu")


class BackendDown(Exception):
    """The backend cannot read GPUs now; ``reason`` is a short snake_case label value."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason
        self.detail = detail or reason


class GpuTelemetry(abc.ABC):
    """A GPU telemetry backend: a sidecar ``MetricSource`` and ``ReadinessSource``."""

    #: value of the ``collector`` label on the sidecar's collector self-metrics
    name = "gpu"
    #: value of the ``backend`` label on ``inferwatch_gpu_backend_up``
    backend = "none"

    def __init__(
        self,
        *,
        scope: GpuScope | None = None,
        timeout_s: float = 2.0,
        stale_s: float = 60.0,
    ) -> None:
        self.scope = scope if scope is not None else GpuScope()
        self.timeout_s = timeout_s
        self.stale_s = stale_s
        self.faults = FaultBook()
        self._inflight: Future[list[Metric]] | None = None
        self._last_good: tuple[float, list[Metric]] | None = None
        self._last_reason: str | None = None
        #: GPUs the backend has seen: uuid -> index, and MIG device UUID -> parent GPU UUID
        self._indices: dict[str, int | None] = {}
        self._mig_parents: dict[str, str] = {}
        #: every GPU found in scope so far (one that vanishes stays ours)
        self._covered: frozenset[str] = frozenset()

    @abc.abstractmethod
    def poll(self) -> list[Metric]:
        """Read every GPU once (blocking); raise ``BackendDown`` when no GPU can be read."""

    def close(self) -> None:
        """Stop background work; a poll still stuck in a driver call is abandoned."""
        self.scope.close()
        self._inflight = None

    def readiness(self) -> Sequence[Condition]:
        """The ``gpu`` condition over the GPUs in scope; none for a node-wide scope."""
        if not self.scope.gated:
            return []
        try:
            selection = self.scope.selection()
        except ScopeUnknown as unknown:
            return [Condition(name="gpu", ok=False, reason=f"GPU allocation unknown: {unknown}")]
        if selection is None:
            return [self.faults.condition()]
        indices, parents, found = self._indices, self._mig_parents, self._covered
        return [
            self.faults.condition(
                lambda u: u in found or selection.covers(u, indices.get(u), parents)
            )
        ]

    def check_faults(
        self, gpu_uuid: str, key: str, labels: Mapping[str, str], value: float
    ) -> None:
        """Apply the GPU fault rules (``faults.fault_in``) to a value just read."""
        fault = fault_in(key, labels, value)
        if fault is not None:
            self.mark_fault(gpu_uuid, *fault)

    def mark_fault(self, gpu_uuid: str, reason: str, detail: str) -> None:
        """Latch a fault, logged once when it is new."""
        if self.faults.mark(gpu_uuid, reason, detail):
            log_event(
                logger,
                logging.ERROR,
                "gpu out of service",
                gpu_uuid=gpu_uuid,
                reason=reason,
                detail=detail,
            )

    def scope_known(self) -> bool:
        try:
            self.scope.selection()
        except ScopeUnknown:
            return False
        return True

    def in_scope(
        self,
        devices: Mapping[str, int | None],
        mig_parents: Mapping[str, str] | None = None,
        also: Iterable[str] = (),
    ) -> set[str]:
        """The UUIDs among ``devices`` (uuid -> index) this replica's scope covers, and
        ``also`` (GPUs a backend found ours by other means), noted for readiness; empty while
        the scope is unknown."""
        self._indices = {**self._indices, **devices}
        if mig_parents:
            self._mig_parents = {**self._mig_parents, **mig_parents}
        try:
            selection: Selection | None = self.scope.selection()
        except ScopeUnknown:
            return set()
        found = covered(selection, devices.items(), self._mig_parents) | set(also)
        self._covered |= found
        return found

    async def collect(self, deadline: float | None = None) -> list[Metric]:
        """The GPUs' families, waiting at most ``deadline`` seconds (default: ``timeout_s``)
        for the poll; a late one is degraded (``gpu_backend_up 0``) and keeps running."""
        if self._inflight is None or self._inflight.done():
            self._inflight = self._start_poll()
        wait = self.timeout_s if deadline is None else min(deadline, self.timeout_s)
        try:
            async with asyncio.timeout(wait):
                families = await asyncio.shield(asyncio.wrap_future(self._inflight))
        except TimeoutError:
            return self._degraded("timeout", f"poll took longer than {wait:g}s")
        except BackendDown as down:
            return self._degraded(down.reason, down.detail)
        except Exception as error:  # a backend bug must not take the scrape down
            logger.exception("gpu poll failed")
            return self._degraded("error", f"{type(error).__name__}: {error}")
        self._last_good = (time.monotonic(), families)
        self._note("")
        return [*families, *self._health(1, "")]

    def _start_poll(self) -> Future[list[Metric]]:
        """Run ``poll`` on a daemon thread, so a call stuck in the driver cannot block exit."""
        future: Future[list[Metric]] = Future()

        def run() -> None:
            future.set_running_or_notify_cancel()
            try:
                future.set_result(self.poll())
            except BaseException as error:
                future.set_exception(error)

        name = f"inferwatch-gpu-{self.backend}"
        threading.Thread(target=run, name=name, daemon=True).start()
        return future

    def _degraded(self, reason: str, detail: str) -> list[Metric]:
        self._note(reason, detail)
        kept: list[Metric] = []
        if self._last_good and time.monotonic() - self._last_good[0] <= self.stale_s:
            kept = self._last_good[1]
        return [*kept, *self._health(0, reason)]

    def _note(self, reason: str, detail: str = "") -> None:
        """One log line per change of state, not one per scrape."""
        if reason == self._last_reason:
            return
        if reason:
            log_event(
                logger,
                logging.WARNING,
                "gpu telemetry unavailable",
                backend=self.backend,
                reason=reason,
                detail=detail,
            )
        elif self._last_reason is not None:
            log_event(logger, logging.INFO, "gpu telemetry recovered", backend=self.backend)
        self._last_reason = reason

    def _health(self, up: int, reason: str) -> list[Metric]:
        """Backend and scope state: fixed label sets, the reason in an info-style series."""
        families = FamilySet()
        families.add("gpu_backend_up", up, {"backend": self.backend})
        if reason:
            families.add("gpu_backend_error_info", 1, {"backend": self.backend, "reason": reason})
        labels = {"source": self.scope.source, "gated": str(self.scope.gated).lower()}
        families.add("gpu_scope_known", int(self.scope_known()), labels)
        return families.families()


class NoGpuTelemetry(GpuTelemetry):
    """No GPU telemetry (``--gpu none``, or ``auto`` on a host without an NVIDIA driver).

    A CPU-only replica has no GPU to read, which is not a backend that fails to read one: it
    serves no GPU series at all, ``inferwatch_gpu_backend_up`` included, so that
    ``InferwatchGPUTelemetryDown`` stays quiet (why ``auto`` found no GPU is in the start log).
    """

    def poll(self) -> list[Metric]:
        return []

    async def collect(self, deadline: float | None = None) -> list[Metric]:
        return []
