"""The signer's certificate authority: its CAs, their schedule, and the roots it publishes.

`ca` (pure: roots and intermediates made), `schedule` (pure: which CA is due to be prepared,
promoted, activated or retired, given the set and `now`), `spiffebundle` (pure: the trust
domain's SPIFFE bundle and its sequence number), `canarying` (pure: the SPIFFE Filesystem
Delivery labels of the published bundles); `rotator` acts on the schedule, `castore` keeps the
CA set in its Secret, and `trustbundles` publishes the trusted roots as ClusterTrustBundles.
"""
