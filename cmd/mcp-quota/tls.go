package main

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
)

// certCheckEvery is how often, at most, the certificate's files are
// looked at for a change.
const certCheckEvery = time.Second

// certFiles serves the certificate of a TLS listener from its files and
// reads them again when they change (their size or modification time),
// looking at most once every certCheckEvery, as handshakes come. A
// changed pair that does not load (a key that does not match, a file
// half written) leaves the previous certificate in use; the error is
// logged once for each change.
type certFiles struct {
	certPath, keyPath string
	clock             clock.Clock
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	seen    [2]fileMark // of the pair that loaded or failed last
	checked time.Time
}

// fileMark is what tells that a file changed.
type fileMark struct {
	size    int64
	modTime time.Time
}

// newCertFiles loads the pair, to be looked at again on c (nil means real
// time): a pair that does not load is an error serve stops with.
func newCertFiles(certPath, keyPath string, c clock.Clock, log *slog.Logger) (*certFiles, error) {
	cf := &certFiles{certPath: certPath, keyPath: keyPath, clock: clock.Or(c), log: log}
	marks, err := cf.marks()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, fmt.Errorf("the TLS certificate %s and key %s (--tls-cert and --tls-key, or tls_cert and tls_key) do not load as a certificate and its private key in PEM: %w", certPath, keyPath, err)
	}
	cf.cert, cf.seen, cf.checked = &cert, marks, cf.clock.Now()
	return cf, nil
}

func (c *certFiles) marks() ([2]fileMark, error) {
	var m [2]fileMark
	for i, p := range []string{c.certPath, c.keyPath} {
		fi, err := os.Stat(p)
		if err != nil {
			return m, fmt.Errorf("the TLS certificate or key (--tls-cert and --tls-key, or tls_cert and tls_key): %w", err)
		}
		m[i] = fileMark{fi.Size(), fi.ModTime()}
	}
	return m, nil
}

// GetCertificate is the tls.Config's: the current certificate, read
// again first when its files changed.
func (c *certFiles) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	if now.Sub(c.checked) < certCheckEvery && !now.Before(c.checked) {
		return c.cert, nil
	}
	c.checked = now
	marks, err := c.marks()
	if err != nil || marks == c.seen {
		return c.cert, nil // a file missing for a moment (being replaced) keeps the certificate in use
	}
	c.seen = marks
	cert, err := tls.LoadX509KeyPair(c.certPath, c.keyPath)
	if err != nil {
		c.log.Warn("the TLS certificate changed but does not load; the previous one stays in use", "cert", c.certPath, "key", c.keyPath, "error", err)
		return c.cert, nil
	}
	c.cert = &cert
	c.log.Info("TLS certificate reloaded", "cert", c.certPath)
	return c.cert, nil
}

// tlsConfig is the listener's TLS configuration: TLS 1.2 and later,
// HTTP/1.1, the certificate from c.
func (c *certFiles) tlsConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: c.GetCertificate, NextProtos: []string{"http/1.1"}}
}
