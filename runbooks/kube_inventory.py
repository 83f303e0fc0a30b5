"""Inventory sources from the Kubernetes API: a model's pods and the GPU nodes, by label selector.

A pod is a replica once it runs, has an IP and is not being deleted; its sidecar is reached at
``<pod IP>:<port>`` (the ``instance`` Prometheus' pod discovery gives it), its model is the
value of ``model_label`` and its breaker population the value of ``population_label`` (for
pods whose model label cannot hold the served name; else the model). A node is listed when
it matches ``selector`` (for example ``nvidia.com/gpu.present=true``), so a control-plane node
outside it is never a target; its pool is ``pool_label``'s value. Lists are read with
``limit`` :data:`~inferwatch.runbooks.inventory.MAX_ENTRIES` and refused when the server says
there is more. What it may read is
:data:`~inferwatch.runbooks.kube_facts.INVENTORY_RULES` (the receiver's ClusterRole).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client

from inferwatch.runbooks.actions.kubernetes_api import DEFAULT_TIMEOUT_S, body, client_for
from inferwatch.runbooks.inventory import MAX_ENTRIES, Entry, Kind, Refused, entry


class _Listing:
    kind: Kind

    def __init__(
        self, api: client.ApiClient | None, host: str | None, kubeconfig: str | None
    ) -> None:
        self._core = client.CoreV1Api(client_for(api, host, kubeconfig))

    async def _list(self, call: Callable[..., Any], what: str, **kwargs: Any) -> list[Any]:
        def work() -> list[Any]:
            found = body(
                call(
                    limit=MAX_ENTRIES,
                    _preload_content=False,
                    _request_timeout=DEFAULT_TIMEOUT_S,
                    **kwargs,
                )
            )
            if (found.get("metadata") or {}).get("continue"):
                raise Refused(f"{what}: more than {MAX_ENTRIES} objects listed")
            items = found.get("items")
            return items if isinstance(items, list) else []

        try:
            return await asyncio.to_thread(work)
        except (client.ApiException, ValueError, OSError) as exc:
            raise Refused(f"{what}: cannot list: {str(exc).splitlines()[0][:200]}") from None


class Pods(_Listing):
    kind: Kind = "replicas"

    def __init__(
        self,
        namespace: str,
        selector: str,
        port: int,
        model_label: str = "inferwatch.io/model",
        population_label: str = "",
        host: str | None = None,
        kubeconfig: str | None = None,
        api: client.ApiClient | None = None,
    ) -> None:
        super().__init__(api, host, kubeconfig)
        self.namespace, self.selector, self.port = namespace, selector, port
        self.model_label, self.population_label = model_label, population_label

    async def entries(self) -> Sequence[Entry]:
        pods = await self._list(
            self._core.list_namespaced_pod,
            f"pods {self.selector!r} in {self.namespace}",
            namespace=self.namespace,
            label_selector=self.selector,
        )
        found = []
        for pod in pods:
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            ip = status.get("podIP")
            if status.get("phase") != "Running" or not ip or meta.get("deletionTimestamp"):
                continue
            labels = {
                "pod": str(meta.get("name", "")),
                "namespace": self.namespace,
                "instance": f"{ip}:{self.port}",
                "node": str((pod.get("spec") or {}).get("nodeName", "")),
            }
            pod_labels = meta.get("labels") or {}
            model = pod_labels.get(self.model_label)
            if model:
                labels["model"] = str(model)
            listed = entry(self.kind, labels)
            population = pod_labels.get(self.population_label) if self.population_label else None
            found.append(Entry(listed.labels, str(population)) if population else listed)
        return found


class Nodes(_Listing):
    kind: Kind = "nodes"

    def __init__(
        self,
        selector: str,
        pool_label: str = "",
        host: str | None = None,
        kubeconfig: str | None = None,
        api: client.ApiClient | None = None,
    ) -> None:
        super().__init__(api, host, kubeconfig)
        self.selector, self.pool_label = selector, pool_label

    async def entries(self) -> Sequence[Entry]:
        nodes = await self._list(
            self._core.list_node, f"nodes {self.selector!r}", label_selector=self.selector
        )
        found = []
        for node in nodes:
            meta = node.get("metadata") or {}
            labels = {"node": str(meta.get("name", ""))}
            pool = (meta.get("labels") or {}).get(self.pool_label) if self.pool_label else None
            if pool:
                labels["pool"] = str(pool)
            found.append(entry(self.kind, labels))
        return found
