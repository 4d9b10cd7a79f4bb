package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/state"
)

// selfSigned returns a self-signed certificate for 127.0.0.1 and
// localhost with serial, and its certificate and key in PEM.
func selfSigned(t *testing.T, serial int64) (*x509.Certificate, []byte, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial),
		Subject:               pkix.Name{CommonName: "mcp-quota test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// writeReplacing writes b to path through a file renamed over it, as a
// certificate manager does, with the modification time at.
func writeReplacing(t *testing.T, path string, b []byte, at time.Time) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(tmp, at, at); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func servedSerial(t *testing.T, c *certFiles) int64 {
	t.Helper()
	cert, err := c.GetCertificate(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.SerialNumber.Int64()
}

// TestCertFilesReloadWhenChanged: the listener's certificate is read
// again when its files change, looked at no more than once a second; a
// changed pair that does not load leaves the one in use, and says so.
func TestCertFilesReloadWhenChanged(t *testing.T) {
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	_, certA, keyA := selfSigned(t, 1)
	writeReplacing(t, certPath, certA, t0)
	writeReplacing(t, keyPath, keyA, t0)
	clk := testkit.NewClock(t0)
	var logs testkit.Buffer
	c, err := newCertFiles(certPath, keyPath, clk, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if got := servedSerial(t, c); got != 1 {
		t.Fatalf("serial %d; want 1", got)
	}

	_, certB, keyB := selfSigned(t, 2)
	writeReplacing(t, certPath, certB, t0.Add(time.Minute))
	writeReplacing(t, keyPath, keyB, t0.Add(time.Minute))
	clk.Advance(certCheckEvery / 2)
	if got := servedSerial(t, c); got != 1 {
		t.Errorf("serial %d within a second of the last look; want 1 (the files are looked at once a second)", got)
	}
	clk.Advance(certCheckEvery)
	if got := servedSerial(t, c); got != 2 {
		t.Errorf("serial %d a second after the files changed; want 2", got)
	}

	// A certificate whose key is another's: refused, the one in use stays.
	_, certC, _ := selfSigned(t, 3)
	writeReplacing(t, certPath, certC, t0.Add(2*time.Minute))
	clk.Advance(certCheckEvery)
	if got := servedSerial(t, c); got != 2 {
		t.Errorf("serial %d after a pair that does not match; want 2 still", got)
	}
	if !strings.Contains(logs.String(), "does not load; the previous one stays in use") {
		t.Errorf("logs %q; want the refused certificate said", logs.String())
	}
	if strings.Contains(logs.String(), "PRIVATE KEY") {
		t.Errorf("the logs show a private key")
	}

	if _, err := newCertFiles(certPath, keyPath, nil, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--tls-cert") {
		t.Errorf("a pair that does not match at the start: %v; want an error naming --tls-cert", err)
	}
}

// TestServeTLS runs `serve --tls-cert --tls-key` as a process: a TLS
// client that trusts the certificate calls REST and MCP, the dashboard's
// session cookie is Secure, and a certificate replaced on disk is served
// to new connections without a restart.
func TestServeTLS(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{Quota: 1000, Window: time.Hour})
	s := newSetup(t, demoKey(url, 1000, time.Hour))
	certPath, keyPath := filepath.Join(s.dir, "tls.crt"), filepath.Join(s.dir, "tls.key")
	a, certA, keyA := selfSigned(t, 1)
	b, certB, keyB := selfSigned(t, 2)
	writeReplacing(t, certPath, certA, time.Now().Add(-time.Minute))
	writeReplacing(t, keyPath, keyA, time.Now().Add(-time.Minute))
	cmd, base, stderr := s.serveProcess(t, "--tls-cert", certPath, "--tls-key", keyPath)
	if !strings.HasPrefix(base, "https://") {
		t.Fatalf("serve announced %s; want https", base)
	}
	roots := x509.NewCertPool()
	roots.AddCert(a)
	roots.AddCert(b)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true}
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	do := func(method, path, token string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, body
	}
	serial := func(resp *http.Response) int64 {
		return resp.TLS.PeerCertificates[0].SerialNumber.Int64()
	}

	resp, body := do("GET", "/k/demo/v1/participants/p-000001", syncToken)
	if resp.StatusCode != http.StatusOK || resp.TLS == nil || serial(resp) != 1 {
		t.Fatalf("REST over TLS: %d %s (TLS %v); want 200 with certificate 1", resp.StatusCode, body, resp.TLS != nil)
	}
	client := gomcp.NewClient(&gomcp.Implementation{Name: "e2e", Version: "1"}, nil)
	sess, err := client.Connect(t.Context(), &gomcp.StreamableClientTransport{Endpoint: base + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{agentToken, tr}}, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("MCP over TLS: %v\n%s", err, stderr.String())
	}
	if res, _ := call(t, sess, "fetch", map[string]any{"path": "/v1/participants/p-000002"}); res.IsError {
		t.Fatalf("fetch over TLS: %s", text(res))
	}
	sess.Close()

	resp, body = do("POST", "/ui/api/session", agentToken)
	if resp.StatusCode != http.StatusOK || len(resp.Cookies()) == 0 {
		t.Fatalf("dashboard sign-in over TLS: %d %s; want a session cookie", resp.StatusCode, body)
	}
	for _, c := range resp.Cookies() {
		if !c.Secure {
			t.Errorf("cookie %s is not Secure on a TLS listener", c.Name)
		}
	}

	writeReplacing(t, certPath, certB, time.Now())
	writeReplacing(t, keyPath, keyB, time.Now())
	eventually(t, 30*time.Second, "the replaced certificate served", func() bool {
		resp, _ := do("GET", "/healthz", "")
		return serial(resp) == 2
	})
	if resp, body := do("GET", "/k/demo/v1/participants/p-000003", syncToken); resp.StatusCode != http.StatusOK {
		t.Errorf("REST with the new certificate: %d %s", resp.StatusCode, body)
	}

	// Plain HTTP to the TLS listener is not served.
	if resp, err := http.Get(strings.Replace(base, "https://", "http://", 1) + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP to the TLS listener answered 200")
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve after SIGTERM: %v\n%s", err, stderr.String())
	}
	for _, secret := range []string{upstreamSecret, agentToken, syncToken, "PRIVATE KEY"} {
		if strings.Contains(stderr.String(), secret) {
			t.Errorf("serve's log shows a secret (%s…)", secret[:6])
		}
	}
}

// TestServeTLSFromConfig: tls_cert and tls_key in the configuration serve
// HTTPS as the flags do.
func TestServeTLSFromConfig(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{Quota: 1000, Window: time.Hour})
	s := newSetup(t, demoKey(url, 1000, time.Hour))
	certPath, keyPath := filepath.Join(s.dir, "tls.crt"), filepath.Join(s.dir, "tls.key")
	a, certA, keyA := selfSigned(t, 7)
	writeReplacing(t, certPath, certA, time.Now())
	writeReplacing(t, keyPath, keyA, time.Now())
	cfg, err := os.ReadFile(s.config)
	if err != nil {
		t.Fatal(err)
	}
	cfg = append([]byte("tls_cert = \""+certPath+"\"\ntls_key = \""+keyPath+"\"\n\n"), cfg...)
	if err := os.WriteFile(s.config, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, base, stderr := s.serveProcess(t)
	roots := x509.NewCertPool()
	roots.AddCert(a)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}, Timeout: 30 * time.Second}
	resp, err := hc.Get(base + "/readyz")
	if err != nil || !strings.HasPrefix(base, "https://") {
		t.Fatalf("GET %s/readyz: %v\n%s", base, err, stderr.String())
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.TLS.PeerCertificates[0].SerialNumber.Int64() != 7 {
		t.Errorf("/readyz over TLS: %d; want 200 with the configured certificate", resp.StatusCode)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve after SIGTERM: %v\n%s", err, stderr.String())
	}
}

// TestServeRefusesBadTLSAndStopFlags: flags that cannot work stop serve
// with an error naming them, before it serves anything.
func TestServeRefusesBadTLSAndStopFlags(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(openKeyConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		says string
	}{
		{[]string{"--tls-cert", missing}, "--tls-cert and --tls-key go together"},
		{[]string{"--tls-cert", missing, "--tls-key", missing}, "--tls-cert and --tls-key"},
		{[]string{"--drain-delay", "-1s"}, "--drain-delay must not be negative"},
		{[]string{"--shutdown-timeout", "0s"}, "--shutdown-timeout must be positive"},
	} {
		var out, errOut strings.Builder
		args := append([]string{"serve", "--listen", "127.0.0.1:0", "--config", filepath.Join(dir, "config.toml"), "--state", testkit.StateFile(t, state.Open)}, tt.args...)
		err := run(t.Context(), args, nil, &out, &errOut, func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("%v: %v; want an error saying %q", tt.args, err, tt.says)
		}
		if strings.Contains(out.String(), "127.0.0.1") {
			t.Errorf("%v: serve announced an address: %q", tt.args, out.String())
		}
	}
}
