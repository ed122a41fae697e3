"""A real local control plane (etcd + kube-apiserver built from Go modules) for tests and demo."""
