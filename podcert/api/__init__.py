"""The Pod Certificates API's rules, each written once, for the signer, the node shim and the audit.

Pure: no `kubernetes`, no `aiohttp`, no clock and no network. Time is an argument; the few that
touch files (`volumes.read_consistently`) are handed their I/O as functions.

- `times`: the API's timestamps (metav1.Time, MicroTime) and podcert's own RFC 3339 stamps.
- `keys`: the key-type table (API name -> generation, stub CSR digest, sizes, curves).
- `validation`: what the API server admits: Kubernetes names (DNS labels and subdomains, signer
  names), maxExpirationSeconds bounds, the 1 h minimum, beginRefreshAt's window, skew.
- `requests`: one reading of a PodCertificateRequest (spec + status), with typed errors.
- `pods`: one reading of a pod's projected podCertificate and clusterTrustBundle sources,
  with field errors (`fields`) and label selectors (`selectors`).
- `credentials`: fresh / refresh due / overdue / expired, the one staleness rule.
- `versions`: which certificates.k8s.io version to use, from a discovery answer.
- `events`: core/v1 Event bodies.
- `volumes`: the kubelet's projected-volume layout, atomic-writer names, the consistent read,
  which paths a volume may hold.
"""
