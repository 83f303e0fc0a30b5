"""The Pod Security Standards' baseline and restricted levels, as a check of one pod template.

Written from the published text (kubernetes.io/docs/concepts/security/pod-security-standards,
the policy as of Kubernetes 1.29-1.33): each control names the fields it restricts and the
values it allows. ``violations`` returns one line per field that breaks a control, so a test
can say which; an empty list is a pod the admission controller admits at that level.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
        "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
    }
)  # fmt: skip
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t",
                           "container_engine_t"})  # fmt: skip
RESTRICTED_VOLUMES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
     "projected", "secret"}
)  # fmt: skip
SECCOMP_ALLOWED = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ALLOWED = frozenset({"RuntimeDefault", "Localhost"})
LEVELS = ("baseline", "restricted")


def containers(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every container of a pod spec, init and ephemeral ones included, with its field path."""
    for field in ("containers", "initContainers", "ephemeralContainers"):
        for container in spec.get(field) or []:
            yield f"{field}[{container.get('name')}]", container


def violations(template: dict[str, Any], level: str) -> list[str]:
    """The controls ``template`` (a pod template: metadata and spec) breaks at ``level``."""
    assert level in LEVELS, level
    found = list(_baseline(template))
    if level == "restricted":
        found += _restricted(template["spec"])
    return found


def _baseline(template: dict[str, Any]) -> Iterator[str]:
    spec = template["spec"]
    pod_context = spec.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            yield f"host namespaces: spec.{field} is true"
    if (pod_context.get("windowsOptions") or {}).get("hostProcess"):
        yield "HostProcess: spec.securityContext.windowsOptions.hostProcess is true"
    yield from _selinux("spec.securityContext", pod_context)
    yield from _seccomp_value("spec.securityContext", pod_context)
    yield from _apparmor_value("spec.securityContext", pod_context)
    for sysctl in pod_context.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            yield f"sysctls: {sysctl.get('name')} is not a safe sysctl"
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            yield f"hostPath volumes: volume {volume['name']} is a hostPath"
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    for key, value in annotations.items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
            value == "runtime/default" or value.startswith("localhost/")
        ):
            yield f"AppArmor: annotation {key} is {value}"
    for where, container in containers(spec):
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            yield f"privileged containers: {where} is privileged"
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            yield f"HostProcess: {where} is a HostProcess container"
        added = set((context.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            yield f"capabilities: {where} adds {sorted(added - BASELINE_CAPABILITIES)}"
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                yield f"host ports: {where} binds hostPort {port['hostPort']}"
        if context.get("procMount", "Default") != "Default":
            yield f"/proc mount type: {where} uses {context['procMount']}"
        yield from _selinux(where, context)
        yield from _seccomp_value(where, context)
        yield from _apparmor_value(where, context)


def _selinux(where: str, context: dict[str, Any]) -> Iterator[str]:
    options = context.get("seLinuxOptions") or {}
    if options.get("type", "") not in SELINUX_TYPES:
        yield f"SELinux: {where} type {options['type']}"
    for field in ("user", "role"):
        if options.get(field):
            yield f"SELinux: {where} sets {field}"


def _seccomp_value(where: str, context: dict[str, Any]) -> Iterator[str]:
    profile = context.get("seccompProfile") or {}
    if profile.get("type") == "Unconfined":
        yield f"seccomp: {where} is Unconfined"


def _apparmor_value(where: str, context: dict[str, Any]) -> Iterator[str]:
    profile = context.get("appArmorProfile") or {}
    if profile and profile.get("type") not in APPARMOR_ALLOWED:
        yield f"AppArmor: {where} is {profile.get('type')}"


def _restricted(spec: dict[str, Any]) -> Iterator[str]:
    pod_context = spec.get("securityContext") or {}
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            yield f"volume types: volume {volume['name']} is {sorted(kinds)}"
    if pod_context.get("runAsUser") == 0:
        yield "running as non-root user: spec.securityContext.runAsUser is 0"
    pod_non_root = pod_context.get("runAsNonRoot") is True
    pod_seccomp = (pod_context.get("seccompProfile") or {}).get("type") in SECCOMP_ALLOWED
    for where, container in containers(spec):
        context = container.get("securityContext") or {}
        if context.get("allowPrivilegeEscalation") is not False:
            yield f"privilege escalation: {where} does not set allowPrivilegeEscalation false"
        non_root = context.get("runAsNonRoot")
        if non_root is False or (non_root is None and not pod_non_root):
            yield f"running as non-root: {where} is not runAsNonRoot"
        if context.get("runAsUser") == 0:
            yield f"running as non-root user: {where} runs as uid 0"
        seccomp = (context.get("seccompProfile") or {}).get("type")
        if seccomp not in SECCOMP_ALLOWED and not (seccomp is None and pod_seccomp):
            yield f"seccomp: {where} has no RuntimeDefault or Localhost profile"
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            yield f"capabilities: {where} does not drop ALL"
        added = set(capabilities.get("add") or [])
        if added - {"NET_BIND_SERVICE"}:
            yield f"capabilities: {where} adds {sorted(added - {'NET_BIND_SERVICE'})}"


def pod_templates(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, pod template) of every pod a workload object makes: Deployments, StatefulSets,
    DaemonSets, Jobs, CronJobs and LeaderWorkerSets (leader and worker templates)."""
    name = f"{document.get('kind')}/{document.get('metadata', {}).get('name')}"
    spec = document.get("spec") or {}
    if document.get("kind") == "CronJob":
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    if "template" in spec:
        yield name, spec["template"]
    lws = spec.get("leaderWorkerTemplate") or {}
    for field in ("leaderTemplate", "workerTemplate"):
        if field in lws:
            yield f"{name}.{field}", lws[field]
