package rest_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// fuzzClient gives up on an answer that does not come.
var fuzzClient = &http.Client{Timeout: 10 * time.Second}

// FuzzForward drives the whole REST side with any header field and any
// path: the upstream gets the key's credential exactly once and nothing
// of the caller's credentials, no hop-by-hop field and nothing Connection
// names, and only paths below the key's base URL; the caller gets back no
// hop-by-hop field and nothing holding the key's secret.
func FuzzForward(f *testing.F) {
	f.Add("X-Foo", "bar", "", "/v1/participants?limit=5")
	f.Add("Connection", "X-Foo", "X-Foo", "/v1/x")
	f.Add("Proxy-Authorization", "Basic Zm9v", "close", "/v1/../admin")
	f.Add("Cookie", "session=caller", "", "/%2e%2e/admin")
	f.Add("Te", "trailers", "Te", "//evil.example/x")
	f.Add("X-Echo", upstreamSecret, "", "/v1/x?api_key=forged")
	f.Add("Authorization", "Bearer "+agentToken, "", "/http://evil.example/")
	f.Add("Keep-Alive", "timeout=1", "Keep-Alive, X-Other", "/v1/@evil")
	up := &recorder{answer: func(w http.ResponseWriter, r *http.Request) {
		for name, vs := range r.Header { // everything comes back, to try the answer side too
			if name != "Authorization" {
				w.Header()[name] = vs
			}
		}
		w.Header().Set("X-Seen-Auth", r.Header.Get("Authorization"))
		io.WriteString(w, "ok")
	}}
	s := newStack(f, stackConfig{Upstream: up, Keys: testkit.Keys(
		testkit.Key{Name: "demo", BaseURL: "%[1]s/api/", SecretEnv: "UPSTREAM_SECRET", MaxRate: 1000000, MaxConcurrency: 100},
		testkit.Key{Name: "other", BaseURL: "%[1]s", Auth: "none"},
	)})
	f.Fuzz(func(t *testing.T, name, value, connection, path string) {
		req, err := http.NewRequest("GET", s.URL+"/k/demo"+path, nil)
		if err != nil || !strings.HasPrefix(path, "/") {
			return
		}
		req.Header.Set("Authorization", "Bearer "+syncToken)
		req.Header.Add(name, value)
		if connection != "" {
			req.Header.Add("Connection", connection)
		}
		before := len(up.requests())
		resp, err := fuzzClient.Do(req)
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("no answer: %v", err)
		}
		if err != nil {
			return // a field the client will not send
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		for n, vs := range resp.Header {
			if strings.Contains(fmt.Sprint(vs), upstreamSecret) {
				t.Fatalf("%s: %q holds the secret", n, vs)
			}
			switch http.CanonicalHeaderKey(n) {
			case "Set-Cookie", "Keep-Alive", "Transfer-Encoding", "Upgrade", "Proxy-Authenticate", "Trailer":
				t.Fatalf("%s: %q came back", n, vs)
			}
		}
		got := up.requests()[before:]
		if resp.StatusCode >= 400 && len(got) == 0 {
			return // refused before the upstream
		}
		if len(got) != 1 {
			t.Fatalf("status %d; the upstream got %d requests, want 1", resp.StatusCode, len(got))
		}
		r := got[0]
		if a := r.Header.Values("Authorization"); len(a) != 1 || a[0] != "Bearer "+upstreamSecret {
			t.Fatalf("Authorization %q, want the key's credential once", a)
		}
		if !strings.HasPrefix(r.URL.Path, "/api/") || r.Host != strings.TrimPrefix(s.UpstreamURL, "http://") {
			t.Fatalf("the upstream got %s %s: outside the base URL", r.Host, r.URL)
		}
		named := map[string]bool{}
		for _, c := range strings.Split(connection, ",") {
			named[http.CanonicalHeaderKey(strings.TrimSpace(c))] = true
		}
		for n, vs := range r.Header {
			c := http.CanonicalHeaderKey(n)
			if named[c] && c != "Authorization" {
				t.Fatalf("%s: %q was forwarded though Connection names it", n, vs)
			}
			switch c {
			case "Cookie", "Proxy-Authorization", "Keep-Alive", "Te", "Upgrade", "Proxy-Connection", "Forwarded", "Prefer":
				t.Fatalf("%s: %q was forwarded", n, vs)
			}
			if strings.Contains(fmt.Sprint(vs), syncToken) {
				t.Fatalf("%s: %q carries the caller's token", n, vs)
			}
		}
	})
}
