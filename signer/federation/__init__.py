"""Federation with other SPIFFE trust domains, and the bundle endpoint they read ours from.

`domains` (pure: the policy's `federation:` section, what a polled bundle means, which roots a
domain may publish); `poller` fetches each peer's bundle and publishes it as a ClusterTrustBundle,
and `endpoint` serves our own (`signer.authority.spiffebundle`) to them.
"""
