// Package credfolder reads a SPIFFE Filesystem Delivery credential folder as go-spiffe sources.
//
// The folder (SPIFFE Filesystem Delivery, spiffe/spiffe PR 376) holds credential-bundle.pem,
// the PKCS#8 private key followed by the X.509 chain (leaf first), and one
// <trust-domain>.trust-bundle.pem per trust domain the workload trusts. The kubelet (or podcert's
// shim) replaces the files through an atomic symlink swap, so one read of a file is always whole.
//
// Folder implements x509svid.Source and x509bundle.Source by reading the files again on every
// call, that is on every TLS handshake when it is given to go-spiffe's tlsconfig: a rotated
// leaf, a new root or a removed trust domain counts from the next handshake on, with no watcher
// and no restart. Parsing is cached by the content's SHA-256, so a handshake costs one small
// read and one hash of each file it needs.
//
// What is guaranteed:
//   - GetX509SVID returns the newest credential go-spiffe accepts (key matches leaf, one SPIFFE
//     ID, leaf and CA usages as the X509-SVID standard says); content it refuses is reported once
//     to the warning hook and the last good credential is kept.
//   - GetX509BundleForTrustDomain returns the roots of <td>.trust-bundle.pem; a trust domain
//     whose file is absent has no bundle, so its peers are refused from the next handshake on
//     (the standard asks for a removed trust domain to be dropped within five minutes).
//   - Files larger than MaxFileBytes are refused, never read whole.
package credfolder

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

const (
	// EnvVar names the credential folder when the application is not told otherwise.
	EnvVar = "SPIFFE_CREDENTIAL_FOLDER"
	// CredentialFile holds the private key (PKCS#8, first) and the chain, leaf first.
	CredentialFile = "credential-bundle.pem"
	// TrustBundleSuffix follows the trust domain's name in each trust bundle's file name.
	TrustBundleSuffix = ".trust-bundle.pem"
	// MaxFileBytes caps what is read of one file (a chain or a bundle is a few kilobytes).
	MaxFileBytes = 1 << 20
)

// DefaultFolders are searched, in order, when neither a flag nor EnvVar names the folder.
var DefaultFolders = []string{
	"/run/secrets/workload-spiffe-credentials",
	"/var/run/secrets/workload-spiffe-credentials",
}

// Locate finds the credential folder as the standard says: the explicit one if given, else
// $SPIFFE_CREDENTIAL_FOLDER, else the first of DefaultFolders that is a directory.
func Locate(explicit string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if env := os.Getenv(EnvVar); env != "" {
		return env, nil
	}
	for _, dir := range DefaultFolders {
		if info, err := os.Stat(dir); err == nil && info.IsDir() {
			return dir, nil
		}
	}
	return "", fmt.Errorf("no credential folder: pass one, set %s, or mount one at %s", EnvVar, DefaultFolders[0])
}

// TrustBundlePath is where the folder keeps a trust domain's roots.
func TrustBundlePath(dir string, td spiffeid.TrustDomain) string {
	// A trust domain's name holds only [a-z0-9._-], so it cannot leave the folder.
	return filepath.Join(dir, td.Name()+TrustBundleSuffix)
}

type digest = [sha256.Size]byte

// Folder is a credential folder as go-spiffe sources; safe for concurrent handshakes.
type Folder struct {
	dir  string
	warn func(string)

	mu      sync.Mutex
	svid    *x509svid.SVID
	svidSum digest
	badSum  digest // the last credential content refused, so it is reported once
	bundles map[spiffeid.TrustDomain]cachedBundle
}

type cachedBundle struct {
	sum    digest
	bundle *x509bundle.Bundle
}

// New reads nothing yet; warn (may be nil) hears of content refused while an older credential
// is kept. Call GetX509SVID once to check that the folder holds a usable credential.
func New(dir string, warn func(string)) *Folder {
	if warn == nil {
		warn = func(string) {}
	}
	return &Folder{dir: dir, warn: warn, bundles: map[spiffeid.TrustDomain]cachedBundle{}}
}

// Dir is the folder read.
func (f *Folder) Dir() string { return f.dir }

// GetX509SVID reads credential-bundle.pem and returns its SVID (parsed again only when the
// content changed). Content go-spiffe refuses, or a file that cannot be read, keeps the last
// good SVID; without one, the error is returned and the handshake fails.
func (f *Folder) GetX509SVID() (*x509svid.SVID, error) {
	path := filepath.Join(f.dir, CredentialFile)
	raw, err := readCapped(path)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		return f.keep(fmt.Errorf("credential bundle %s: %w", path, err))
	}
	sum := sha256.Sum256(raw)
	if f.svid != nil && sum == f.svidSum {
		return f.svid, nil
	}
	if sum == f.badSum {
		return f.keep(nil)
	}
	// The same bytes serve as both arguments: go-spiffe's PEM reader takes the CERTIFICATE
	// blocks for the chain and the PRIVATE KEY block for the key.
	svid, err := x509svid.Parse(raw, raw)
	if err != nil {
		f.badSum = sum
		return f.keep(fmt.Errorf("credential bundle %s: %w", path, err))
	}
	f.svid, f.svidSum = svid, sum
	return svid, nil
}

// keep returns the last good SVID (reporting err once), or err when there is none.
func (f *Folder) keep(err error) (*x509svid.SVID, error) {
	if f.svid == nil {
		if err == nil {
			err = errors.New("the credential bundle was refused before")
		}
		return nil, err
	}
	if err != nil {
		f.warn("keeping the previous credential: " + err.Error())
	}
	return f.svid, nil
}

// GetX509BundleForTrustDomain reads <td>.trust-bundle.pem. No file means no bundle: peers of
// that trust domain are refused. An unreadable or malformed file is an error too (the atomic
// writer never leaves one), so a peer is never judged against roots the folder no longer holds.
func (f *Folder) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	path := TrustBundlePath(f.dir, td)
	raw, err := readCapped(path)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		delete(f.bundles, td)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no trust bundle for trust domain %q in %s", td.Name(), f.dir)
		}
		return nil, fmt.Errorf("trust bundle %s: %w", path, err)
	}
	sum := sha256.Sum256(raw)
	if cached, ok := f.bundles[td]; ok && cached.sum == sum {
		return cached.bundle, nil
	}
	bundle, err := x509bundle.Parse(td, raw)
	if err != nil {
		delete(f.bundles, td)
		return nil, fmt.Errorf("trust bundle %s: %w", path, err)
	}
	if bundle.Empty() {
		delete(f.bundles, td)
		return nil, fmt.Errorf("trust bundle %s holds no certificate", path)
	}
	f.bundles[td] = cachedBundle{sum: sum, bundle: bundle}
	return bundle, nil
}

func readCapped(path string) ([]byte, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	raw, err := io.ReadAll(io.LimitReader(file, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > MaxFileBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxFileBytes)
	}
	return raw, nil
}
