"""The node agent (``inferwatch node-agent``): the one pod on a node with the node's rights.

A DaemonSet of its own, apart from the sidecars: it reads the kubelet's PodResources socket
for the sidecars (:mod:`.agent`) and carries out the receiver's GPU reset requests on its
node (:mod:`.gpu_reset`); what it asks of Kubernetes is plain data (:mod:`.kube_facts`).
"""
