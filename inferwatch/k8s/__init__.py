"""The Kubernetes kit: its generated manifests and the autoscaling resources."""
