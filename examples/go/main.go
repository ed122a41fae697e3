// Command spiffe-mtls is a Go workload on podcert's credentials: go-spiffe's tlsconfig over a
// SPIFFE Filesystem Delivery credential folder (package credfolder), read again on every TLS
// handshake, so leaf and CA rotations need no restart.
//
//	spiffe-mtls server --folder DIR --listen 127.0.0.1:8443 --peer-id spiffe://td/ns/shop/sa/web
//	spiffe-mtls client --folder DIR --url https://127.0.0.1:8443/ --peer-id spiffe://td/ns/shop/sa/api
//
// Both ends authorize the peer inside the handshake with go-spiffe's AuthorizeOneOf (--peer-id,
// repeatable) or AuthorizeMemberOf (--peer-trust-domain), after go-spiffe has verified its chain
// against the bundle of the peer's own trust domain (<td>.trust-bundle.pem): a refused client
// never reaches a handler, a refused server never receives a byte of the request.
//
// The server answers GET / as podcert's Python example server does, {"caller", "caller_serial",
// "server_serial"}, and drains connections made with a credential since rotated: their next
// answer carries "Connection: close", so keep-alive clients reconnect and see the new leaf.
// The client makes one connection per request (each call is a handshake with the material
// current at that moment) at --rate per second for --duration, or --requests calls, or until
// SIGTERM, and exits 1 if any call failed.
//
// Output is JSON, one object per line on stdout: events as they happen ({"event": "listening"},
// "presented", "caller", "refused", "server"), then a summary on exit.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
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
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"podcert.local/examples/go/credfolder"
)

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "server" && os.Args[1] != "client") {
		fmt.Fprintln(os.Stderr, "usage: spiffe-mtls server|client [flags] (-h for the flags)")
		os.Exit(2)
	}
	run := server
	if os.Args[1] == "client" {
		run = client
	}
	if err := run(os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "spiffe-mtls:", err)
		os.Exit(1)
	}
}

var outMu sync.Mutex

func emit(value map[string]any) {
	out, err := json.Marshal(value)
	if err != nil {
		panic(err) // maps of strings and numbers always marshal
	}
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Println(string(out))
}

func warn(message string) { fmt.Fprintln(os.Stderr, "spiffe-mtls:", message) }

// repeated is a flag that may be given several times.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

// common are the flags both ends take: where the files are and who the peer may be.
type common struct {
	folder  string
	peerIDs repeated
	peerTDs repeated
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.folder, "folder", "", "credential folder (default: $"+credfolder.EnvVar+", then "+strings.Join(credfolder.DefaultFolders, ", ")+")")
	fs.Var(&c.peerIDs, "peer-id", "a SPIFFE ID the peer may have (repeatable)")
	fs.Var(&c.peerTDs, "peer-trust-domain", "any SPIFFE ID in this trust domain (repeatable)")
}

// open locates the folder and checks that it holds a credential go-spiffe accepts now.
func (c *common) open() (*credfolder.Folder, error) {
	dir, err := credfolder.Locate(c.folder)
	if err != nil {
		return nil, err
	}
	folder := credfolder.New(dir, warn)
	if _, err := folder.GetX509SVID(); err != nil {
		return nil, err
	}
	return folder, nil
}

// authorizer is go-spiffe's AuthorizeOneOf for the IDs and AuthorizeMemberOf for each trust
// domain; any of them allows. With no rule nobody could talk to us, which is a usage error.
func (c *common) authorizer() (tlsconfig.Authorizer, error) {
	var rules []tlsconfig.Authorizer
	if len(c.peerIDs) > 0 {
		ids := make([]spiffeid.ID, 0, len(c.peerIDs))
		for _, raw := range c.peerIDs {
			id, err := spiffeid.FromString(raw)
			if err != nil {
				return nil, fmt.Errorf("--peer-id %q: %w", raw, err)
			}
			ids = append(ids, id)
		}
		rules = append(rules, tlsconfig.AuthorizeOneOf(ids...))
	}
	for _, raw := range c.peerTDs {
		td, err := spiffeid.TrustDomainFromString(raw)
		if err != nil {
			return nil, fmt.Errorf("--peer-trust-domain %q: %w", raw, err)
		}
		rules = append(rules, tlsconfig.AuthorizeMemberOf(td))
	}
	switch len(rules) {
	case 0:
		return nil, errors.New("no peer rule: give --peer-id or --peer-trust-domain")
	case 1:
		return rules[0], nil
	}
	return func(id spiffeid.ID, chains [][]*x509.Certificate) error {
		for _, rule := range rules {
			if rule(id, chains) == nil {
				return nil
			}
		}
		return fmt.Errorf("unexpected ID %q", id)
	}, nil
}

func serial(cert *x509.Certificate) string { return cert.SerialNumber.Text(16) }

func stopSignals() chan os.Signal {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	return stop
}

// --- server ------------------------------------------------------------------------------------

type identityServer struct {
	folder *credfolder.Folder

	mu        sync.Mutex
	served    int
	refused   int
	callers   map[string]bool
	clients   []string        // client leaf serials, in the order first seen
	presented map[string]bool // server leaf serials presented so far
	servedBy  sync.Map        // the TCP connection -> the serial presented on it
}

type connKey struct{}

func (s *identityServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 { // the handshake requires one
		http.Error(w, "no client certificate", http.StatusForbidden)
		return
	}
	leaf := r.TLS.PeerCertificates[0]
	id, err := x509svid.IDFromCert(leaf) // authorized in the handshake, so it has one
	if err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	presented := ""
	if conn, ok := r.Context().Value(connKey{}).(*tls.Conn); ok {
		if value, ok := s.servedBy.Load(conn.NetConn()); ok {
			presented = value.(string)
		}
	}
	// Drain: a connection made with a credential since rotated gets this answer, then is
	// closed, so a keep-alive client reconnects and meets the new leaf.
	if current, err := s.folder.GetX509SVID(); err == nil && serial(current.Certificates[0]) != presented {
		w.Header().Set("Connection", "close")
	}
	s.mu.Lock()
	s.served++
	s.callers[id.String()] = true
	first := !contains(s.clients, serial(leaf))
	if first {
		s.clients = append(s.clients, serial(leaf))
	}
	s.mu.Unlock()
	if first {
		emit(map[string]any{"event": "caller", "caller": id.String(), "caller_serial": serial(leaf)})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"caller": id.String(), "caller_serial": serial(leaf), "server_serial": presented,
	})
}

func contains(list []string, value string) bool {
	for _, item := range list {
		if item == value {
			return true
		}
	}
	return false
}

func server(args []string) error {
	fs := flag.NewFlagSet("server", flag.ExitOnError)
	var c common
	c.register(fs)
	listen := fs.String("listen", "127.0.0.1:8443", "address to listen on (port 0: any free one)")
	_ = fs.Parse(args)
	folder, err := c.open()
	if err != nil {
		return err
	}
	authorizer, err := c.authorizer()
	if err != nil {
		return err
	}
	s := &identityServer{folder: folder, callers: map[string]bool{}, presented: map[string]bool{}}
	config := tlsconfig.MTLSServerConfig(folder, folder, authorizer)
	// A resumed session skips VerifyPeerCertificate: the peer was judged when the session
	// began, against the files of that time. No tickets, so every connection is judged anew.
	// (The client side resumes nothing: go-spiffe's config leaves ClientSessionCache nil.)
	config.SessionTicketsDisabled = true
	// Record which leaf each handshake presented (for the answers and the drain), and count
	// each refusal made inside the handshake (chain or SPIFFE ID).
	getCertificate, verify := config.GetCertificate, config.VerifyPeerCertificate
	config.GetCertificate = func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		cert, err := getCertificate(hello)
		if err != nil {
			return nil, err
		}
		leaf := serial(cert.Leaf)
		s.servedBy.Store(hello.Conn, leaf)
		s.mu.Lock()
		first := !s.presented[leaf]
		s.presented[leaf] = true
		s.mu.Unlock()
		if first {
			emit(map[string]any{"event": "presented", "serial": leaf})
		}
		return cert, nil
	}
	config.VerifyPeerCertificate = func(raw [][]byte, chains [][]*x509.Certificate) error {
		err := verify(raw, chains)
		if err != nil {
			s.mu.Lock()
			s.refused++
			s.mu.Unlock()
			emit(map[string]any{"event": "refused", "reason": err.Error()})
		}
		return err
	}
	listener, err := tls.Listen("tcp", *listen, config)
	if err != nil {
		return err
	}
	httpServer := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       30 * time.Second,
		ErrorLog:          nil,
		ConnContext: func(ctx context.Context, conn net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, conn)
		},
		ConnState: func(conn net.Conn, state http.ConnState) {
			if tlsConn, ok := conn.(*tls.Conn); ok && state == http.StateClosed {
				s.servedBy.Delete(tlsConn.NetConn())
			}
		},
	}
	emit(map[string]any{"event": "listening", "listening": listener.Addr().String(), "folder": folder.Dir()})
	stop := stopSignals()
	done := make(chan error, 1)
	go func() { done <- httpServer.Serve(listener) }()
	select {
	case <-stop:
	case err := <-done:
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = httpServer.Shutdown(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	callers := make([]string, 0, len(s.callers))
	for id := range s.callers {
		callers = append(callers, id)
	}
	sort.Strings(callers)
	current := ""
	if svid, err := folder.GetX509SVID(); err == nil {
		current = serial(svid.Certificates[0])
	}
	emit(map[string]any{
		"served": s.served, "refused": s.refused, "callers": callers,
		"client_serials": s.clients, "serial": current,
	})
	return nil
}

// --- client ------------------------------------------------------------------------------------

func client(args []string) error {
	fs := flag.NewFlagSet("client", flag.ExitOnError)
	var c common
	c.register(fs)
	url := fs.String("url", "", "e.g. https://127.0.0.1:8443/")
	rate := fs.Float64("rate", 20, "requests per second")
	duration := fs.Duration("duration", 0, "how long to call (0: until SIGTERM, or --requests)")
	requests := fs.Int("requests", 0, "stop after this many calls (0: no limit)")
	_ = fs.Parse(args)
	if *url == "" || *rate <= 0 {
		return errors.New("--url is required and --rate must be positive")
	}
	folder, err := c.open()
	if err != nil {
		return err
	}
	authorizer, err := c.authorizer()
	if err != nil {
		return err
	}
	// A new connection per request: each call is a handshake with the files as they are now.
	transport := &http.Transport{
		TLSClientConfig:   tlsconfig.MTLSClientConfig(folder, folder, authorizer),
		DisableKeepAlives: true,
	}
	httpClient := &http.Client{Transport: transport, Timeout: 10 * time.Second}
	ok, failed := 0, 0
	errs := map[string]int{}
	serials := []string{}
	call := func() error {
		resp, err := httpClient.Get(*url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s answered %d: %s", *url, resp.StatusCode, strings.TrimSpace(string(body)))
		}
		answer := map[string]any{}
		if err := json.Unmarshal(body, &answer); err != nil {
			return fmt.Errorf("%s answered no JSON object: %w", *url, err)
		}
		leaf := resp.TLS.PeerCertificates[0]
		if s := serial(leaf); !contains(serials, s) {
			serials = append(serials, s)
			id, _ := x509svid.IDFromCert(leaf)
			emit(map[string]any{"event": "server", "server_serial": s, "server_id": id.String()})
		}
		return nil
	}
	stop := stopSignals()
	var deadline <-chan time.Time
	if *duration > 0 {
		deadline = time.After(*duration)
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / *rate))
	defer tick.Stop()
	for *requests == 0 || ok+failed < *requests {
		if err := call(); err != nil {
			failed++
			if errs[err.Error()] == 0 {
				warn("request failed: " + err.Error())
			}
			errs[err.Error()]++
		} else {
			ok++
		}
		if *requests != 0 && ok+failed >= *requests {
			break
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
		"requests": ok + failed, "ok": ok, "failed": failed, "errors": errs, "server_serials": serials,
	})
	if failed > 0 {
		os.Exit(1)
	}
	return nil
}
