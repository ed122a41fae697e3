"""The signer's tamper-evident audit log.

`writer` appends the hash-chained, checkpointed lines to the file (the format is
`podcert.auditlog`'s); `trail` is the signer's side: entries that fail closed, and the key
that vouches for them.
"""
