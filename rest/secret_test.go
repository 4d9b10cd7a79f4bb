package rest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcp-quota/mcp-quota/internal/leaktest"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// TestSecretsNeverLeave drives every kind of answer through REST and MCP
// over HTTP — accepted, upstream error, local refusal, bad path, unknown
// key, forbidden key, bad token, unreachable upstream, an upstream that
// echoes its credential — and then scans every output channel for the
// key's secret: response bodies and fields, MCP results, the log, the
// activity, the state file (with its WAL), and the errors the call path
// returns. The callers' tokens must not appear in any of them either.
// Last, it formats every carrier of a secret with %v, %+v, %#v and slog
// JSON.
func TestSecretsNeverLeave(t *testing.T) {
	t.Parallel()
	// An upstream that puts its credential wherever it can in the
	// fields of its answer (its body is its own business).
	leaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("api_key")
		w.Header().Set("Link", "<"+r.URL.String()+`>; rel="self"`)
		w.Header().Set("Location", r.URL.String())
		w.Header().Set("X-Echo-Key", key)
		w.Header().Set("WWW-Authenticate", `ApiKey realm="`+key+`"`)
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error":"nope"}`)
	}))
	t.Cleanup(leaky.Close)
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	keys := testkit.Keys(
		testkit.Key{Name: "demo", BaseURL: "%[1]s", SecretEnv: "UPSTREAM_SECRET", Auth: "bearer", Profile: "ietf", MaxRate: 1000,
			Policies: []testkit.Policy{{Name: "default", Quota: 8, Window: time.Minute}}},
		testkit.Key{Name: "other", BaseURL: "%[1]s", SecretEnv: "UPSTREAM_SECRET"},
		testkit.Key{Name: "leaky", BaseURL: leaky.URL + "/v1/", SecretEnv: "UPSTREAM_SECRET", Auth: "query:api_key", MaxRate: 1000},
		testkit.Key{Name: "down", BaseURL: down.URL, SecretEnv: "UPSTREAM_SECRET", Auth: "header:X-Api-Key", MaxRate: 1000},
	)
	callersAll := callersWith(map[string][]string{"sync": {"demo", "leaky", "down"}})
	s := newStack(t, stackConfig{Keys: keys, Callers: callersAll})

	var out bytes.Buffer // every output, as the callers saw it
	record := func(what string, resp *http.Response, body []byte) {
		fmt.Fprintf(&out, "== %s\n%d %v\n%s\n", what, resp.StatusCode, resp.Header, body)
	}
	rest := []struct{ name, method, path, token, body string }{
		{"accepted", "GET", "/k/demo/v1/participants?limit=3", syncToken, ""},
		{"echo", "POST", "/k/demo/v1/echo?q=1", syncToken, `{"a":1}`},
		{"upstream error", "GET", "/k/demo/v1/nothing", syncToken, ""},
		{"bad path", "GET", "/k/demo/v1/%2e%2e/admin", syncToken, ""},
		{"unknown key", "GET", "/k/nope/v1/x", syncToken, ""},
		{"forbidden key", "GET", "/k/demo/v1/x", strangerToken, ""},
		{"bad token", "GET", "/k/demo/v1/x", "not-a-token-" + syncToken[:4], ""},
		{"leaky upstream", "GET", "/k/leaky/items?x=1", syncToken, ""},
		{"unreachable upstream", "GET", "/k/down/items", syncToken, ""},
	}
	for _, c := range rest {
		var body *strings.Reader
		if c.body != "" {
			body = strings.NewReader(c.body)
		}
		var resp *http.Response
		var b []byte
		if body != nil {
			resp, b = s.do(t, c.method, c.path, c.token, body, "Prefer", "wait=0", "Cookie", "session=x")
		} else {
			resp, b = s.do(t, c.method, c.path, c.token, nil, "Prefer", "wait=0", "Cookie", "session=x")
		}
		record("REST "+c.name, resp, b)
	}

	// MCP over HTTP, as the agent.
	ctx := context.Background()
	mc := mcpClient(t, s, agentToken)
	callTool := func(name string, args map[string]any) {
		req := mcp.CallToolRequest{}
		req.Params.Name, req.Params.Arguments = name, args
		res, err := mc.CallTool(ctx, req)
		b, _ := json.Marshal(res)
		fmt.Fprintf(&out, "== MCP %s %v\n%s\n%v\n", name, args, b, err)
	}
	callTool("fetch", map[string]any{"key": "demo", "path": "/v1/participants?limit=2"})
	callTool("fetch", map[string]any{"key": "demo", "path": "/v1/echo", "headers": map[string]any{"Authorization": "Bearer stolen", "X-Test": "1"}})
	callTool("fetch", map[string]any{"key": "demo", "path": "/v1/../admin"})
	callTool("fetch", map[string]any{"key": "nope", "path": "/v1/x"})
	callTool("quota_status", map[string]any{})
	// Spend what is left, then be refused locally on both sides.
	for range 8 {
		resp, b := s.do(t, "GET", "/k/demo/v1/participants/p-000001", syncToken, nil, "Prefer", "wait=0")
		if resp.StatusCode == 429 {
			record("REST local refusal", resp, b)
			break
		}
	}
	callTool("fetch", map[string]any{"key": "demo", "path": "/v1/participants?limit=1", "max_wait_s": 0})
	if !strings.Contains(out.String(), `"rateLimited"`) {
		t.Errorf("no local refusal was driven")
	}

	for _, p := range []string{"/v1/quota", "/v1/activity?key=demo&limit=1000", "/v1/activity?key=leaky", "/v1/activity?key=down", "/healthz"} {
		resp, b := s.do(t, "GET", p, syncToken, nil)
		record("REST "+p, resp, b)
	}

	// The errors the call path returns, as any caller could print them.
	for _, name := range []string{"down", "leaky"} {
		k, _ := s.Keys.Key(name)
		for _, path := range []string{"/items", "/%2e%2e/x"} {
			resp, err := s.Client.Do(ctx, k, upstream.Request{Caller: "sync", Transport: "rest", Path: path})
			if resp != nil {
				resp.Body.Close()
			}
			fmt.Fprintf(&out, "== error %s %s\n%v\n%+v\n%#v\n", name, path, err, err, err)
		}
	}

	channels := map[string]string{
		"answers and errors": out.String(),
		"log":                s.Log.String(),
	}
	maps.Copy(channels, leaktest.StateFiles(t, s.DBPath)) // a leased call's outcome goes through a journal
	if _, ok := channels["state file-wal"]; !ok {
		t.Fatal("the state file has no write-ahead log to scan")
	}
	// The channels hold what the calls left: the scan is not of empty files.
	if !strings.Contains(channels["log"], "no answer from the upstream") || !strings.Contains(channels["state file"]+channels["state file-wal"], "/v1/participants") {
		t.Fatalf("the channels hold too little to be scanned: log %d bytes, WAL %d bytes", len(channels["log"]), len(channels["state file-wal"]))
	}
	for name, text := range channels {
		for _, secret := range []string{upstreamSecret, syncToken, agentToken, strangerToken} {
			if i := strings.Index(text, secret); i >= 0 {
				t.Errorf("%s holds %q: …%s…", name, secret, text[max(i-200, 0):min(i+len(secret)+50, len(text))])
			}
		}
	}

	t.Run("formatting", func(t *testing.T) {
		k, _ := s.Keys.Key("demo")
		secret, _ := k.Credential()
		var b bytes.Buffer
		log := slog.New(slog.NewJSONHandler(&b, nil))
		carriers := map[string]any{"key": k, "key value": *k, "caller": s.Keys.Callers()[0], "caller value": *s.Keys.Callers()[0],
			"secret": secret, "store": s.Keys, "caller token": s.Keys.Callers()[0]}
		for name, v := range carriers {
			fmt.Fprintf(&b, "%s: %v %+v %#v %s %q\n", name, v, v, v, v, v)
			log.Info(name, "value", v, "group", slog.GroupValue(slog.Any("inner", v)))
			if j, err := json.Marshal(v); err == nil {
				b.Write(j)
			}
		}
		log.Info("secret as attribute", slog.Any("secret", secret), slog.String("text", secret.String()))
		for _, secret := range []string{upstreamSecret, syncToken, agentToken, strangerToken} {
			if strings.Contains(b.String(), secret) {
				t.Errorf("formatting shows %q:\n%s", secret, b.String())
			}
		}
		if !strings.Contains(b.String(), "[redacted]") {
			t.Errorf("no redaction shown:\n%s", b.String())
		}
		var _ keystore.Secret = secret
	})
}
