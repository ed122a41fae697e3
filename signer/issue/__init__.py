"""Issuance: from a PodCertificateRequest to its one terminal status.

`decide` (pure: the numbered checks, with the subject key and the annotations' names read out
of hostile bytes; an Issue, Deny or Retry), `settle` (pure: the status, audit entry and Event a
decision becomes); `facts` holds the pods, nodes, ServiceAccounts and Services a decision reads,
in bounded shapes, never from a cache staler than the request, and `controller` runs the loop
that fetches, decides and writes.
"""
