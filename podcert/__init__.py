"""podcert: workload identity certificates on the Kubernetes Pod Certificates API."""

__version__ = "0.1.0"
