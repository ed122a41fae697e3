// Command reference answers, with the reference implementations themselves, the questions
// podcert's hand-written plumbing answers, so that differential tests can compare the two on
// generated input (tests/integration/test_reference_*.py; built by devcluster/build.py):
//
//	kubeconfig  client-go (k8s.io/client-go/tools/clientcmd and rest, v0.37.2, the release the
//	            devcluster builds) loads a kubeconfig (or a KUBECONFIG-style list of them,
//	            merged by clientcmd's loading rules) at its current context or a given one, with
//	            kubectl's --as/--as-group overrides, and prints what a client would use: base
//	            URL, trusted CAs, client certificate, the bearer token a request carries, exec
//	            plugin (its interactive mode and the cluster info it is given), TLS server
//	            name, proxy, namespace, impersonation; or the error
//	selector    apimachinery's metav1.LabelSelectorAsSelector on a LabelSelector, and whether a
//	            label set matches it; or the error
//	pem         encoding/pem's Decode loop: every block (type, headers, bytes, offsets) and what
//	            is left
//	spiffeid    go-spiffe's spiffeid.FromString and spiffeid.TrustDomainFromString
//	proxy       golang.org/x/net/http/httpproxy (what net/http and client-go use) on an
//	            environment and a URL
//
// It reads one JSON request per line on stdin ({"op": ..., ...}) and writes one JSON answer per
// line on stdout, so one process serves a whole hypothesis run. A refusal by the reference is an
// answer ({"error": "..."}), never an exit.
package main

import (
	"bufio"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/net/http/httpproxy"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/transport"
)

type request struct {
	Op       string            `json:"op"`
	Path     string            `json:"path"`      // kubeconfig: --kubeconfig
	Paths    []string          `json:"paths"`     // kubeconfig: KUBECONFIG's files instead
	Context  string            `json:"context"`   // kubeconfig: --context
	As       string            `json:"as"`        // kubeconfig: --as
	AsGroups []string          `json:"as_groups"` // kubeconfig: --as-group
	Environ  map[string]string `json:"environ"`   // kubeconfig, proxy
	Selector json.RawMessage   `json:"selector"`  // selector: a metav1.LabelSelector, or null
	Labels   map[string]string `json:"labels"`    // selector
	Data     []byte            `json:"data"`      // pem (base64 in JSON)
	Text     string            `json:"text"`      // spiffeid
	URL      string            `json:"url"`       // proxy
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 0, 1<<20), 64<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		var answer any
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			answer = refused(fmt.Errorf("request: %w", err))
		} else {
			answer = handle(req)
		}
		if err := out.Encode(answer); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func refused(err error) map[string]string { return map[string]string{"error": err.Error()} }

func handle(req request) any {
	var answer any
	var err error
	switch req.Op {
	case "kubeconfig":
		answer, err = kubeconfig(req)
	case "selector":
		answer, err = selector(req.Selector, req.Labels)
	case "pem":
		answer = decodePEM(req.Data)
	case "spiffeid":
		answer = spiffeID(req.Text)
	case "proxy":
		answer, err = proxy(req.Environ, req.URL)
	default:
		err = fmt.Errorf("unknown op %q", req.Op)
	}
	if err != nil {
		return refused(err)
	}
	return answer
}

// --- kubeconfig -------------------------------------------------------------------------------

type resolved struct {
	Server        string   `json:"server"`          // the base URL requests go to, no trailing '/'
	Insecure      bool     `json:"insecure"`        // server certificate not checked
	CAs           []string `json:"cas"`             // sha256 of each trusted CA (DER); nil: system roots
	ClientCert    string   `json:"client_cert"`     // sha256 of the client leaf (DER), or ""
	Token         string   `json:"token"`           // the bearer token a request carries, or ""
	TokenFile     string   `json:"token_file"`      // where it is re-read from, or ""
	ExecCommand   string   `json:"exec_command"`    // the exec plugin's command, or ""
	ExecArgs      []string `json:"exec_args"`       // and its arguments
	ExecVersion   string   `json:"exec_version"`    // and its API version
	TLSServerName string   `json:"tls_server_name"` // the name checked instead of the host, or ""
	Proxy         string   `json:"proxy"`           // the proxy requests to the server go through, or ""
	Namespace     string   `json:"namespace"`       // the namespace a command defaults to
	AsUser        string   `json:"as_user"`         // Impersonate-User, or ""
	AsUID         string   `json:"as_uid"`          // Impersonate-Uid, or ""
	AsGroups      []string `json:"as_groups"`       // Impersonate-Group
	ExecMode      string   `json:"exec_mode"`       // the exec plugin's interactiveMode, or ""
	ExecCluster   any      `json:"exec_cluster"`    // what provideClusterInfo passes, or nil
}

// execCluster is rest.ConfigToExecCluster's answer as the plugin sees it (client.authentication
// v1's JSON names), the CA as the sha256 of its bytes.
type execCluster struct {
	Server        string          `json:"server"`
	TLSServerName string          `json:"tls-server-name"`
	Insecure      bool            `json:"insecure-skip-tls-verify"`
	CA            string          `json:"ca_sha256"`
	ProxyURL      string          `json:"proxy-url"`
	Config        json.RawMessage `json:"config"`
}

// kubeconfig resolves the file's current context (or the request's context) the way kubectl
// does with those flags: clientcmd builds a rest.Config (validating it), rest.TLSConfigFor
// loads and checks every file and PEM it names, and rest.TransportFor builds the round
// trippers (auth providers, exec plugins).
func kubeconfig(req request) (any, error) {
	setProxyEnviron(req.Environ)
	// kubectl --kubeconfig=path: explicit loading rules resolve relative paths against the
	// file's folder (clientcmd.LoadFromFile alone does not); KUBECONFIG: a precedence list.
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: req.Path}
	if len(req.Paths) > 0 {
		rules = &clientcmd.ClientConfigLoadingRules{Precedence: req.Paths}
	}
	overrides := &clientcmd.ConfigOverrides{CurrentContext: req.Context}
	overrides.AuthInfo.Impersonate = req.As
	overrides.AuthInfo.ImpersonateGroups = req.AsGroups
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	config, err := loader.ClientConfig()
	if err != nil {
		return nil, err
	}
	namespace, _, err := loader.Namespace()
	if err != nil {
		return nil, err
	}
	base, _, err := rest.DefaultServerUrlFor(config)
	if err != nil {
		return nil, err
	}
	tlsConfig, err := rest.TLSConfigFor(config)
	if err != nil {
		return nil, err
	}
	if _, err := rest.TransportFor(config); err != nil {
		return nil, err
	}
	out := resolved{
		Server:        strings.TrimRight(base.String(), "/"),
		Insecure:      config.Insecure,
		TLSServerName: config.ServerName,
		TokenFile:     config.BearerTokenFile,
		Namespace:     namespace,
		AsUser:        config.Impersonate.UserName,
		AsUID:         config.Impersonate.UID,
		AsGroups:      config.Impersonate.Groups,
	}
	if tlsConfig != nil && tlsConfig.RootCAs != nil {
		transportConfig, err := config.TransportConfig()
		if err != nil {
			return nil, err
		}
		data := transportConfig.TLS.CAData
		if len(data) == 0 && transportConfig.TLS.CAFile != "" {
			if data, err = os.ReadFile(transportConfig.TLS.CAFile); err != nil {
				return nil, err
			}
		}
		out.CAs = poolDigests(data)
	}
	if tlsConfig != nil && tlsConfig.GetClientCertificate != nil {
		cert, err := tlsConfig.GetClientCertificate(&tls.CertificateRequestInfo{})
		if err != nil {
			return nil, err
		}
		if cert != nil && len(cert.Certificate) > 0 {
			out.ClientCert = digest(cert.Certificate[0])
		}
	}
	if out.Token, err = bearer(config); err != nil {
		return nil, err
	}
	if exec := config.ExecProvider; exec != nil {
		out.ExecCommand, out.ExecArgs, out.ExecVersion = exec.Command, exec.Args, exec.APIVersion
		out.ExecMode = string(exec.InteractiveMode)
		if exec.ProvideClusterInfo {
			if out.ExecCluster, err = clusterInfo(config); err != nil {
				return nil, err
			}
		}
	}
	via := config.Proxy
	if via == nil {
		via = func(r *http.Request) (*url.URL, error) {
			return httpproxy.FromEnvironment().ProxyFunc()(r.URL)
		}
	}
	proxyURL, err := via(&http.Request{URL: base})
	if err != nil {
		return nil, err
	}
	if proxyURL != nil {
		out.Proxy = proxyURL.String()
	}
	return out, nil
}

func clusterInfo(config *rest.Config) (any, error) {
	cluster, err := rest.ConfigToExecCluster(config)
	if err != nil {
		return nil, err
	}
	out := execCluster{
		Server:        cluster.Server,
		TLSServerName: cluster.TLSServerName,
		Insecure:      cluster.InsecureSkipTLSVerify,
		ProxyURL:      cluster.ProxyURL,
	}
	if len(cluster.CertificateAuthorityData) > 0 {
		out.CA = digest(cluster.CertificateAuthorityData)
	}
	if cluster.Config != nil {
		if out.Config, err = json.Marshal(cluster.Config); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// bearer is the token client-go's bearer round tripper puts on a request: the token file's
// content (trimmed, re-read as it rotates) when a file is named and readable, else the token.
func bearer(config *rest.Config) (string, error) {
	if config.BearerTokenFile != "" {
		token, err := transport.NewCachedFileTokenSource(config.BearerTokenFile).Token()
		if err == nil {
			return token.AccessToken, nil
		}
		if config.BearerToken == "" {
			return "", err
		}
	}
	return config.BearerToken, nil
}

// poolDigests lists what x509.CertPool.AppendCertsFromPEM takes from PEM: every CERTIFICATE
// block without headers that parses, in order.
func poolDigests(data []byte) []string {
	digests := []string{}
	for len(data) > 0 {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" || len(block.Headers) != 0 {
			continue
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			continue
		}
		digests = append(digests, digest(block.Bytes))
	}
	return digests
}

func digest(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// --- proxy ------------------------------------------------------------------------------------

var proxyVariables = []string{
	"HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy",
	"REQUEST_METHOD",
}

// setProxyEnviron makes the process environment's proxy variables exactly `environ`'s, so that
// httpproxy.FromEnvironment reads them as it reads any process's.
func setProxyEnviron(environ map[string]string) {
	for _, name := range proxyVariables {
		os.Unsetenv(name)
	}
	for name, value := range environ {
		os.Setenv(name, value)
	}
}

func proxy(environ map[string]string, target string) (any, error) {
	setProxyEnviron(environ)
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	found, err := httpproxy.FromEnvironment().ProxyFunc()(u)
	if err != nil {
		return nil, err
	}
	if found == nil {
		return map[string]any{"proxy": nil}, nil
	}
	return map[string]any{"proxy": found.String()}, nil
}

// --- label selectors --------------------------------------------------------------------------

func selector(raw json.RawMessage, set map[string]string) (any, error) {
	var parsed *metav1.LabelSelector
	if len(raw) > 0 && string(raw) != "null" {
		parsed = &metav1.LabelSelector{}
		decoder := json.NewDecoder(strings.NewReader(string(raw)))
		if err := decoder.Decode(parsed); err != nil {
			return nil, fmt.Errorf("decoding: %w", err)
		}
	}
	sel, err := metav1.LabelSelectorAsSelector(parsed)
	if err != nil {
		return nil, err
	}
	return map[string]bool{"matches": sel.Matches(labels.Set(set))}, nil
}

// --- PEM --------------------------------------------------------------------------------------

type block struct {
	Type    string            `json:"type"`
	Headers map[string]string `json:"headers"`
	Bytes   []byte            `json:"bytes"`
	Start   int               `json:"start"` // offset where Decode began looking for it
	End     int               `json:"end"`   // offset just past it (and its line end)
}

func decodePEM(data []byte) any {
	blocks := []block{}
	offset := 0
	rest := data
	for {
		found, after := pem.Decode(rest)
		if found == nil {
			break
		}
		end := len(data) - len(after)
		blocks = append(blocks, block{found.Type, found.Headers, found.Bytes, offset, end})
		offset, rest = end, after
	}
	return map[string]any{"blocks": blocks, "rest": len(rest)}
}

// --- SPIFFE IDs -------------------------------------------------------------------------------

func spiffeID(text string) any {
	answer := map[string]any{}
	if id, err := spiffeid.FromString(text); err != nil {
		answer["id_error"] = err.Error()
	} else {
		answer["trust_domain"] = id.TrustDomain().Name()
		answer["path"] = id.Path()
	}
	if td, err := spiffeid.TrustDomainFromString(text); err != nil {
		answer["td_error"] = err.Error()
	} else {
		answer["td"] = td.Name()
	}
	return answer
}
