"""The node agent: the kubelet's half of Pod Certificates (keys, requests, atomic projection)."""
