// Command gospiffe checks podcert's credentials with go-spiffe, the reference SPIFFE library,
// so that conformance is judged by code no one at podcert wrote. Whatever it refuses is a bug in
// podcert. The integration tests (tests/integration/test_gospiffe.py) build it with
// devcluster/build.py and run one subcommand per check:
//
//	verify        load a projected credential bundle and trust bundle (x509svid, x509bundle)
//	              and verify the SVID with x509svid.Verify
//	client        mutual TLS to a server (tlsconfig.MTLSClientConfig), authorizing it with
//	              AuthorizeID or AuthorizeMemberOf; GET the URL and print the answers
//	serve         a mutual TLS server (tlsconfig.MTLSServerConfig) answering like the Python
//	              example server; files are read again on every handshake, so it rotates
//	fetch-bundle  federation.FetchBundle from a SPIFFE bundle endpoint (https_spiffe or
//	              https_web) and print what go-spiffe parsed
//	workload      fetch the X509 context from a SPIFFE Workload API (SPIRE's agent) with
//	              workloadapi and print the SVID's ID and every trust domain's roots
//
// client and serve take their SVID and bundles from files, or with --workload-api from a
// Workload API (workloadapi.X509Source, which follows SVID and bundle rotation, federated
// trust domains' bundles included). client --duration keeps calling (a new connection per
// request) until the time is up or SIGTERM, counting failures instead of stopping at one.
//
// Every subcommand prints one JSON object on stdout (serve: one when listening, one on exit)
// and exits 1 with the reason on stderr when go-spiffe refuses something.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
)

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: gospiffe verify|client|serve|fetch-bundle [flags]"))
	}
	commands := map[string]func([]string) error{
		"verify":       verify,
		"client":       client,
		"serve":        serve,
		"fetch-bundle": fetchBundle,
		"workload":     workload,
	}
	run, ok := commands[os.Args[1]]
	if !ok {
		fail(fmt.Errorf("unknown subcommand %q", os.Args[1]))
	}
	if err := run(os.Args[2:]); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gospiffe:", err)
	os.Exit(1)
}

func emit(value any) {
	out, err := json.Marshal(value)
	if err != nil {
		fail(err)
	}
	fmt.Println(string(out))
}

// files is the projected volume as go-spiffe sources: both are read again on every call, so a
// rotated credential or trust bundle is used from the next handshake on. The credential bundle
// holds the PKCS#8 key and the chain in one file: go-spiffe's PEM reader skips the blocks of the
// other type, so the same path serves as both.
type files struct {
	credential, trust string
	trustDomain       spiffeid.TrustDomain // the trust bundle's; the SVID's own when not given
}

func (f *files) GetX509SVID() (*x509svid.SVID, error) {
	return x509svid.Load(f.credential, f.credential)
}

func (f *files) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	if td != f.trustDomain {
		return nil, fmt.Errorf("no trust bundle for trust domain %q (only %q)", td, f.trustDomain)
	}
	return x509bundle.Load(td, f.trust)
}

type credentialFlags struct {
	credential, trust, trustDomain, workloadAPI *string
}

func addCredentialFlags(fs *flag.FlagSet) credentialFlags {
	return credentialFlags{
		credential:  fs.String("credential-bundle", "", "projected credential bundle (key, then chain)"),
		trust:       fs.String("trust-bundle", "", "projected trust bundle (PEM roots)"),
		trustDomain: fs.String("trust-domain", "", "the trust bundle's trust domain (default: the SVID's)"),
		workloadAPI: fs.String("workload-api", "", "instead of files: a Workload API socket, unix:///path"),
	}
}

// sources are where the SVID and the bundles come from: files, or a Workload API.
type sources interface {
	x509svid.Source
	x509bundle.Source
}

// sources opens the files, or the Workload API (waiting for its first X509 context); close
// releases the Workload API's stream.
func (c credentialFlags) sources(ctx context.Context) (sources, func(), error) {
	if *c.workloadAPI == "" {
		f, _, err := c.open()
		return f, func() {}, err
	}
	if *c.credential != "" || *c.trust != "" {
		return nil, nil, errors.New("--workload-api or the files, not both")
	}
	source, err := workloadapi.NewX509Source(ctx, workloadapi.WithClientOptions(workloadapi.WithAddr(*c.workloadAPI)))
	if err != nil {
		return nil, nil, fmt.Errorf("workload API %s: %w", *c.workloadAPI, err)
	}
	return source, func() { _ = source.Close() }, nil
}

// open checks the files once with go-spiffe and returns them as sources.
func (c credentialFlags) open() (*files, *x509svid.SVID, error) {
	if *c.credential == "" || *c.trust == "" {
		return nil, nil, errors.New("--credential-bundle and --trust-bundle are required")
	}
	f := &files{credential: *c.credential, trust: *c.trust}
	svid, err := f.GetX509SVID()
	if err != nil {
		return nil, nil, err
	}
	f.trustDomain = svid.ID.TrustDomain()
	if *c.trustDomain != "" {
		if f.trustDomain, err = spiffeid.TrustDomainFromString(*c.trustDomain); err != nil {
			return nil, nil, err
		}
	}
	return f, svid, nil
}

// authorizer is AuthorizeID for an ID, AuthorizeMemberOf for a trust domain.
func authorizer(id, trustDomain string) (tlsconfig.Authorizer, error) {
	switch {
	case id != "" && trustDomain != "":
		return nil, errors.New("give a peer ID or a peer trust domain, not both")
	case id != "":
		parsed, err := spiffeid.FromString(id)
		if err != nil {
			return nil, err
		}
		return tlsconfig.AuthorizeID(parsed), nil
	case trustDomain != "":
		parsed, err := spiffeid.TrustDomainFromString(trustDomain)
		if err != nil {
			return nil, err
		}
		return tlsconfig.AuthorizeMemberOf(parsed), nil
	}
	return nil, errors.New("no peer rule: give a peer ID or a peer trust domain")
}

// tlsEnd is either end of go-spiffe's mutual TLS: tlsconfig.MTLSClientConfig or MTLSServerConfig.
type tlsEnd func(x509svid.Source, x509bundle.Source, tlsconfig.Authorizer, ...tlsconfig.Option) *tls.Config

// mtlsConfig is the TLS configuration of one end: this side's SVID and bundles from the
// credential flags (files, or a Workload API waited for at most 30 s), the peer authorized by
// its ID or its trust domain. release closes the sources when the end is done with them.
func mtlsConfig(end tlsEnd, creds credentialFlags, peerID, peerTD string) (*tls.Config, func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, release, err := creds.sources(ctx)
	if err != nil {
		return nil, nil, err
	}
	authz, err := authorizer(peerID, peerTD)
	if err != nil {
		release()
		return nil, nil, err
	}
	return end(src, src, authz), release, nil
}

func serial(cert *x509.Certificate) string { return cert.SerialNumber.Text(16) }

func verify(args []string) error {
	fs := flag.NewFlagSet("verify", flag.ExitOnError)
	creds := addCredentialFlags(fs)
	_ = fs.Parse(args)
	f, svid, err := creds.open()
	if err != nil {
		return err
	}
	id, chains, err := x509svid.Verify(svid.Certificates, f)
	if err != nil {
		return err
	}
	roots := []string{}
	for _, chain := range chains {
		roots = append(roots, chain[len(chain)-1].Subject.String())
	}
	bundle, err := f.GetX509BundleForTrustDomain(f.trustDomain)
	if err != nil {
		return err
	}
	emit(map[string]any{
		"spiffe_id":   id.String(),
		"serial":      serial(svid.Certificates[0]),
		"chain":       len(svid.Certificates),
		"key":         fmt.Sprintf("%T", svid.PrivateKey),
		"roots":       len(bundle.X509Authorities()),
		"verified_to": roots,
	})
	return nil
}

func client(args []string) error {
	fs := flag.NewFlagSet("client", flag.ExitOnError)
	creds := addCredentialFlags(fs)
	url := fs.String("url", "", "e.g. https://127.0.0.1:8443/")
	serverID := fs.String("server-id", "", "authorize the server with AuthorizeID")
	serverTD := fs.String("server-trust-domain", "", "authorize the server with AuthorizeMemberOf")
	requests := fs.Int("requests", 3, "requests to send (without --duration)")
	duration := fs.Duration("duration", 0, "keep calling this long (or until SIGTERM), counting failures")
	interval := fs.Duration("interval", 100*time.Millisecond, "with --duration: time between requests")
	_ = fs.Parse(args)
	config, release, err := mtlsConfig(tlsconfig.MTLSClientConfig, creds, *serverID, *serverTD)
	if err != nil {
		return err
	}
	defer release()
	// With --duration every request makes a new connection, so each one is a new handshake
	// with the material current at that moment (rotations are seen at once).
	transport := &http.Transport{
		TLSClientConfig:   config,
		DisableKeepAlives: *duration > 0,
	}
	defer transport.CloseIdleConnections()
	httpClient := &http.Client{Transport: transport, Timeout: 10 * time.Second}
	call := func() (map[string]any, *x509.Certificate, error) {
		resp, err := httpClient.Get(*url)
		if err != nil {
			return nil, nil, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, nil, fmt.Errorf("%s answered %d: %s", *url, resp.StatusCode, body)
		}
		answer := map[string]any{}
		if err := json.Unmarshal(body, &answer); err != nil {
			return nil, nil, fmt.Errorf("%s answered no JSON object: %w", *url, err)
		}
		return answer, resp.TLS.PeerCertificates[0], nil
	}
	if *duration > 0 {
		return callFor(call, *duration, *interval)
	}
	answers := []map[string]any{}
	var server *x509.Certificate
	for range *requests {
		answer, peer, err := call()
		if err != nil {
			return err
		}
		answers = append(answers, answer)
		server = peer
	}
	out := map[string]any{"ok": len(answers), "answers": answers}
	if server != nil {
		serverID, err := x509svid.IDFromCert(server)
		if err != nil {
			return err
		}
		out["server_id"], out["server_serial"] = serverID.String(), serial(server)
	}
	emit(out)
	return nil
}

// callFor calls until `duration` is over or SIGTERM comes, and prints the counts: ok, failed
// (with each distinct error), and the server serials and caller serials seen, in order.
func callFor(call func() (map[string]any, *x509.Certificate, error), duration, interval time.Duration) error {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	deadline := time.After(duration)
	ok, failed := 0, 0
	errs := map[string]int{}
	serverSerials, callerSerials := []string{}, []string{}
	seen := map[string]bool{}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		answer, server, err := call()
		if err != nil {
			failed++
			errs[err.Error()]++
		} else {
			ok++
			if s := serial(server); !seen["s"+s] {
				seen["s"+s] = true
				serverSerials = append(serverSerials, s)
			}
			if s, _ := answer["caller_serial"].(string); !seen["c"+s] {
				seen["c"+s] = true
				callerSerials = append(callerSerials, s)
			}
		}
		select {
		case <-stop:
		case <-deadline:
		case <-tick.C:
			continue
		}
		break
	}
	emit(map[string]any{
		"ok": ok, "failed": failed, "errors": errs,
		"server_serials": serverSerials, "caller_serials": callerSerials,
	})
	return nil
}

// identityServer answers GET / as the Python example server does: who called, with which
// certificate, and which certificate this server presented on that connection.
type identityServer struct {
	mu       sync.Mutex
	served   int
	callers  map[string]int
	serials  []string
	servedBy sync.Map // net.Conn (the TCP connection) -> the serial presented on it
}

type connKey struct{}

func (s *identityServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		http.Error(w, "no client certificate", http.StatusForbidden)
		return
	}
	leaf := r.TLS.PeerCertificates[0]
	id, err := x509svid.IDFromCert(leaf)
	if err != nil { // tlsconfig authorized it already, so this is not expected
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	presented := ""
	if conn, ok := r.Context().Value(connKey{}).(*tls.Conn); ok {
		if value, ok := s.servedBy.Load(conn.NetConn()); ok {
			presented = value.(string)
		}
	}
	s.mu.Lock()
	s.served++
	if s.callers[id.String()] == 0 {
		s.serials = append(s.serials, serial(leaf))
	}
	s.callers[id.String()]++
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"caller": id.String(), "caller_serial": serial(leaf), "server_serial": presented,
	})
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	creds := addCredentialFlags(fs)
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on")
	clientID := fs.String("client-id", "", "authorize clients with AuthorizeID")
	clientTD := fs.String("client-trust-domain", "", "authorize clients with AuthorizeMemberOf")
	_ = fs.Parse(args)
	config, release, err := mtlsConfig(tlsconfig.MTLSServerConfig, creds, *clientID, *clientTD)
	if err != nil {
		return err
	}
	defer release()
	handler := &identityServer{callers: map[string]int{}}
	getCertificate := config.GetCertificate
	config.GetCertificate = func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		cert, err := getCertificate(hello)
		if err == nil && cert.Leaf != nil {
			handler.servedBy.Store(hello.Conn, serial(cert.Leaf))
		}
		return cert, err
	}
	listener, err := tls.Listen("tcp", *listen, config)
	if err != nil {
		return err
	}
	server := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ConnContext: func(ctx context.Context, conn net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, conn)
		},
		ConnState: func(conn net.Conn, state http.ConnState) {
			if tlsConn, ok := conn.(*tls.Conn); ok && state == http.StateClosed {
				handler.servedBy.Delete(tlsConn.NetConn())
			}
		},
		ErrorLog: nil,
	}
	emit(map[string]any{"listening": listener.Addr().String()})
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- server.Serve(listener) }()
	select {
	case <-stop:
	case err := <-done:
		return err
	}
	shutdown, cancelShutdown := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelShutdown()
	_ = server.Shutdown(shutdown)
	handler.mu.Lock()
	defer handler.mu.Unlock()
	callers := []string{}
	for id := range handler.callers {
		callers = append(callers, id)
	}
	sort.Strings(callers)
	emit(map[string]any{"served": handler.served, "callers": callers, "client_serials": handler.serials})
	return nil
}

func fetchBundle(args []string) error {
	fs := flag.NewFlagSet("fetch-bundle", flag.ExitOnError)
	url := fs.String("url", "", "the bundle endpoint, e.g. https://127.0.0.1:8443/")
	endpointID := fs.String("endpoint-id", "", "https_spiffe: the endpoint's SPIFFE ID")
	trust := fs.String("trust-bundle", "", "https_spiffe: the trust domain's roots (PEM), from an earlier fetch or out of band")
	webRoots := fs.String("web-roots", "", "https_web: roots (PEM) for the endpoint's Web PKI certificate")
	trustDomain := fs.String("trust-domain", "", "https_web: the trust domain the bundle is for")
	_ = fs.Parse(args)
	var td spiffeid.TrustDomain
	var option federation.FetchOption
	switch {
	case *endpointID != "" && *trust != "":
		id, err := spiffeid.FromString(*endpointID)
		if err != nil {
			return err
		}
		td = id.TrustDomain()
		roots, err := x509bundle.Load(td, *trust)
		if err != nil {
			return err
		}
		option = federation.WithSPIFFEAuth(roots, id)
	case *webRoots != "" && *trustDomain != "":
		var err error
		if td, err = spiffeid.TrustDomainFromString(*trustDomain); err != nil {
			return err
		}
		roots, err := x509bundle.Load(td, *webRoots) // a PEM reader; these are Web PKI roots
		if err != nil {
			return err
		}
		pool := x509.NewCertPool()
		for _, root := range roots.X509Authorities() {
			pool.AddCert(root)
		}
		option = federation.WithWebPKIRoots(pool)
	default:
		return errors.New("give --endpoint-id with --trust-bundle (https_spiffe) or --web-roots with --trust-domain (https_web)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bundle, err := federation.FetchBundle(ctx, td, *url, option)
	if err != nil {
		return err
	}
	out := map[string]any{"trust_domain": bundle.TrustDomain().String()}
	if sequence, ok := bundle.SequenceNumber(); ok {
		out["sequence"] = sequence
	}
	if hint, ok := bundle.RefreshHint(); ok {
		out["refresh_hint_seconds"] = int64(hint / time.Second)
	}
	authorities := []string{}
	for _, root := range bundle.X509Authorities() {
		authorities = append(authorities, base64.StdEncoding.EncodeToString(root.Raw))
	}
	out["x509_authorities"] = authorities
	emit(out)
	return nil
}

func workload(args []string) error {
	fs := flag.NewFlagSet("workload", flag.ExitOnError)
	socket := fs.String("workload-api", "", "the Workload API socket, unix:///path")
	_ = fs.Parse(args)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	x509Context, err := workloadapi.FetchX509Context(ctx, workloadapi.WithAddr(*socket))
	if err != nil {
		return fmt.Errorf("workload API %s: %w", *socket, err)
	}
	svid := x509Context.DefaultSVID()
	bundles := map[string][]string{}
	for _, bundle := range x509Context.Bundles.Bundles() {
		roots := []string{}
		for _, root := range bundle.X509Authorities() {
			roots = append(roots, base64.StdEncoding.EncodeToString(root.Raw))
		}
		bundles[bundle.TrustDomain().String()] = roots
	}
	emit(map[string]any{
		"spiffe_id": svid.ID.String(),
		"serial":    serial(svid.Certificates[0]),
		"bundles":   bundles,
	})
	return nil
}
