"""Issuance: from a PodCertificateRequest to its one terminal status.

`requested` (pure: the subject key and the annotations' names out of hostile bytes), `decide`
(pure: the numbered checks, an Issue, Deny or Retry), `settle` (pure: the status, audit entry
and Event a decision becomes); `fresh` reads the facts a decision must not take from a stale
cache, and `controller` runs the loop that fetches, decides and writes.
"""
