// Package oidctest starts a real OpenID provider for tests: the npm
// package oidc-provider, pinned in testdata/oidc (installed there by
// `npm ci`), run with Node on loopback. See testdata/oidc/provider.mjs for
// its accounts and clients.
package oidctest

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Dir is testdata/oidc, found from this file.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata", "oidc")
}

// Start starts count issuers in one Node process, stopped when the test
// ends, and returns their issuer URLs. user is the account the sign-in
// page signs in ("alice", "bob"). It skips the test when Node or the
// package is missing, unless CI=true: there it fails.
func Start(t testing.TB, count int, user string) []string {
	t.Helper()
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
	cmd := exec.Command(node, filepath.Join(dir, "provider.mjs"), string(rune('0'+count)))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "OIDC_USER="+user)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("oidc-provider did not start: %v\n%s", err, stderr.String())
	}
	var out struct{ Issuers []string }
	if err := json.Unmarshal([]byte(line), &out); err != nil || len(out.Issuers) != count {
		t.Fatalf("oidc-provider said %q: %v", line, err)
	}
	return out.Issuers
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
