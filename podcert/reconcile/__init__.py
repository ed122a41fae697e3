"""The controller runtime the signer and the shim share: level-based reconciling by name.

`reflector` (list then watch, relist on 410, a store kept in sync), `cache` (the watched
objects' indexes), `workqueue` (one key at a time, deduplicated, with capped backoff),
`ratelimit` (token buckets on an injected clock), and `runtime` (workers, readiness and
shutdown for a process made of them).
"""
