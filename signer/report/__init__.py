"""How the signer stands, read from the cluster, for people and scripts: `podcert status`,
`podcert explain pod` and `podcert version`.

`status` and `explain` decide (pure: a model built from the objects as fetched and `now`; no
reads, no clock), `render` turns a model into a table (pure), `fetch` reads the objects and is
the one place that builds the cluster client, and `cli` wires the commands. The JSON and YAML
documents are the models' `as_json()` under `podcert.output`'s header (docs/OUTPUT.md).
"""
