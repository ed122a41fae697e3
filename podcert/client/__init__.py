"""podcert's own Kubernetes client, the product's one way to the API server (the `kubernetes`
package is a development dependency only).

`commandline` (where a person's command finds the cluster, kubectl's flags), `loadingrules`
(client-go's: which files, merged how, which context, whom to impersonate), `kubeconfig` and
`kubeconfigfiles` (the settings a context gives), `clientcerts` and `execcredential`
(credentials that rotate), `endpoints` and `proxies` (where a request goes), `transport`
(HTTP/1.1 on pooled TLS connections, read with h11's grammar), `rest` (typed calls, list pages
and watches, `ApiError`), `pages` (a list page decoded an element at a time), `discovery` (what
the server serves), and `refusals` (when 401s and 403s mean the identity is wrong).
"""
