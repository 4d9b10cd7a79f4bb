// Package oidctest starts a real OpenID provider for tests: the npm
// package oidc-provider, pinned in testdata/oidc (installed there by
// `npm ci`), run with Node on loopback. See testdata/oidc/provider.mjs for
// its accounts and clients.
package oidctest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// Dir is testdata/oidc, found from this file.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata", "oidc")
}

// Start starts count issuers in one Node process, stopped when the test
// ends, and returns their issuer URLs. user is the account the sign-in
// page signs in ("alice", "bob"); "" makes it a login form a person (a
// browser) fills in with an account and Password. It skips the test when Node or the
// package is missing, unless CI=true: there it fails; and under -short,
// which leaves out what starts Node.js.
func Start(t testing.TB, count int, user string) []string {
	t.Helper()
	testkit.SkipShort(t, "starts an OpenID provider on Node.js")
	dir := Dir()
	node, err := exec.LookPath("node")
	missing := ""
	switch {
	case err != nil:
		missing = "node is not installed"
	case !exists(filepath.Join(dir, "node_modules", "oidc-provider", "package.json")):
		missing = "oidc-provider is not installed: run `npm ci --prefix testdata/oidc`"
	}
	if missing != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and %s", missing)
		}
		t.Skip(missing + "; under CI=true this is a failure")
	}
	// The provider prints its issuers within a second or two. Once, under
	// the whole suite, a provider process stopped before printing them and
	// never went on; such a process is killed and started again, once.
	line, err := startProvider(t, node, dir, count, user)
	if errors.Is(err, errProviderSilent) {
		t.Logf("%v; starting it again", err)
		line, err = startProvider(t, node, dir, count, user)
	}
	if err != nil {
		t.Fatal(err)
	}
	var out struct{ Issuers []string }
	if err := json.Unmarshal([]byte(line), &out); err != nil || len(out.Issuers) != count {
		t.Fatalf("oidc-provider said %q: %v", line, err)
	}
	return out.Issuers
}

// Password is the password of every account on the login form.
const Password = "test-password"

// errProviderSilent reports a provider that did not print its issuers in
// time.
var errProviderSilent = errors.New("oidc-provider did not print its issuers within 60 s")

// startProvider starts provider.mjs and returns the line it prints once
// its issuers listen. The process is stopped when the test ends.
func startProvider(t testing.TB, node, dir string, count int, user string) (string, error) {
	cmd := exec.Command(node, filepath.Join(dir, "provider.mjs"), string(rune('0'+count)))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "OIDC_USER="+user)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return "", err
	}
	stop := func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	type read struct {
		line string
		err  error
	}
	got := make(chan read, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		got <- read{line, err}
	}()
	select {
	case r := <-got:
		if r.err != nil {
			stop()
			return "", fmt.Errorf("oidc-provider did not start: %v\n%s", r.err, stderr.String())
		}
		t.Cleanup(stop)
		return r.line, nil
	case <-time.After(60 * time.Second):
		stop()
		return "", fmt.Errorf("%w\n%s", errProviderSilent, stderr.String())
	}
}

// ClientCredentials gets an access token from issuer for resource with
// the client credentials grant, as a sync job does.
func ClientCredentials(t testing.TB, issuer, client, secret, resource, scope string) string {
	t.Helper()
	form := url.Values{"grant_type": {"client_credentials"}, "resource": {resource}, "scope": {scope}}
	var tok struct {
		AccessToken string `json:"access_token"`
	}
	post(t, issuer+"/token", client, secret, form, &tok)
	if tok.AccessToken == "" {
		t.Fatal("no access token")
	}
	return tok.AccessToken
}

// Revoke revokes token at issuer (RFC 7009), as its client.
func Revoke(t testing.TB, issuer, client, secret, token string) {
	t.Helper()
	post(t, issuer+"/token/revocation", client, secret, url.Values{"token": {token}, "token_type_hint": {"access_token"}}, nil)
}

func post(t testing.TB, u, client, secret string, form url.Values, v any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(client, secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s: %s", u, resp.Status, body)
	}
	if v != nil {
		if err := json.Unmarshal(body, v); err != nil {
			t.Fatalf("POST %s: %v", u, err)
		}
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
