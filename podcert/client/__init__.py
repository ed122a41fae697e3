"""podcert's own Kubernetes client, the product's one way to the API server (the `kubernetes`
package is a development dependency only).

`kubeconfig` (client-go's loading rules), `clientcerts` and `execcredential` (credentials that
rotate), `endpoints` and `proxies` (where a request goes), `transport` (HTTP/1.1 on pooled TLS
connections, read with h11's grammar), `rest` (typed calls, list pages and watches, `ApiError`),
`pages` (a list page decoded an element at a time), `discovery` (what the server serves), and
`refusals` (when 401s and 403s mean the identity is wrong).
"""
