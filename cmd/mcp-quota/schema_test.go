package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// odd is an upstream with the answers the demo API never gives: a binary
// body, a refusal with a problem, a 500.
func odd(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/image":
			w.Header().Set("Content-Type", "image/png")
			w.Write([]byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"))
		case "/refused":
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "120")
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write([]byte(`{"status":429,"code":"rateLimited","detail":"slow down"}`))
		case "/broken":
			w.WriteHeader(http.StatusInternalServerError)
			w.Write([]byte("boom"))
		default:
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Write([]byte(strings.Repeat("text ", 50)))
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestEveryResultMatchesItsSchema: every result either tool can produce
// validates against the outputSchema the tool declares in tools/list (a
// client that has listed the tools checks it and throws otherwise), and
// every error result without structured content carries a stable code.
func TestEveryResultMatchesItsSchema(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 20, time.Minute),
		testkit.Key{Name: "odd", BaseURL: odd(t), SecretEnv: "DEMO_SECRET", Methods: []string{"GET", "POST"}},
		noSecretKey(url), tinyKey(url))
	sess := s.stdioSession(t, nil)
	schemas := outputSchemas(t, sess)

	calls := []struct {
		name string
		tool string
		args map[string]any
	}{
		{"a page", "fetch", map[string]any{"key": "demo", "path": "/v1/participants?limit=5"}},
		{"a page again (304 with the kept copy)", "fetch", map[string]any{"key": "demo", "path": "/v1/participants?limit=5"}},
		{"a cut body", "fetch", map[string]any{"key": "demo", "path": "/v1/report?bytes=40000", "max_length": 100}},
		{"the next page of the cut body (kept copy)", "fetch", map[string]any{"key": "demo", "path": "/v1/report?bytes=40000", "max_length": 100, "start_index": 100}},
		{"past the end of the body", "fetch", map[string]any{"key": "demo", "path": "/v1/report?bytes=40000", "start_index": 1 << 20}},
		{"the largest page", "fetch", map[string]any{"key": "demo", "path": "/v1/report?bytes=400000", "max_length": 100000}},
		{"not found", "fetch", map[string]any{"key": "demo", "path": "/v1/nothing"}},
		{"binary", "fetch", map[string]any{"key": "odd", "path": "/image"}},
		{"refused upstream", "fetch", map[string]any{"key": "odd", "path": "/refused"}},
		{"after the refusal: paused", "fetch", map[string]any{"key": "odd", "path": "/refused", "max_wait_s": 0}},
		{"server error", "fetch", map[string]any{"key": "odd", "path": "/broken", "method": "POST"}},
		{"the only call of tiny", "fetch", map[string]any{"key": "tiny", "path": "/v1/participants/p-000001"}},
		{"tiny paused locally", "fetch", map[string]any{"key": "tiny", "path": "/v1/participants/p-000002", "max_wait_s": 0}},
		{"unknown key", "fetch", map[string]any{"key": "nope", "path": "/"}},
		{"no key of four", "fetch", map[string]any{"path": "/"}},
		{"bad path", "fetch", map[string]any{"key": "demo", "path": "/v1/../x"}},
		{"absolute URL", "fetch", map[string]any{"key": "demo", "path": "http://169.254.169.254/"}},
		{"missing path", "fetch", map[string]any{"key": "demo"}},
		{"path of the wrong type", "fetch", map[string]any{"key": "demo", "path": 5}},
		{"unknown argument", "fetch", map[string]any{"key": "demo", "path": "/", "url": "x"}},
		{"negative max_length", "fetch", map[string]any{"key": "demo", "path": "/", "max_length": -1}},
		{"method not open", "fetch", map[string]any{"key": "demo", "path": "/", "method": "DELETE"}},
		{"no credential", "fetch", map[string]any{"key": "nosecret", "path": "/"}},
		{"status of every key", "quota_status", map[string]any{}},
		{"status of one key", "quota_status", map[string]any{"key": "odd"}},
		{"status of a paused key", "quota_status", map[string]any{"key": "tiny"}},
		{"status of an unknown key", "quota_status", map[string]any{"key": "nope"}},
		{"status with a bad argument", "quota_status", map[string]any{"key": 5}},
	}
	validated, failures := 0, 0
	for _, c := range calls {
		res, err := sess.CallTool(t.Context(), &gomcp.CallToolParams{Name: c.tool, Arguments: c.args})
		if err != nil {
			t.Fatalf("%s: protocol error %v", c.name, err)
		}
		if res.StructuredContent == nil {
			if !res.IsError {
				t.Errorf("%s: a successful result without structuredContent", c.name)
			}
			if errorCode(res) == "" || text(res) == "" {
				t.Errorf("%s: error result without a code or a sentence: %+v", c.name, res)
			}
			failures++
			continue
		}
		raw, err := json.Marshal(res.StructuredContent)
		if err != nil {
			t.Fatal(err)
		}
		v, err := jsonschema.UnmarshalJSON(strings.NewReader(string(raw)))
		if err != nil {
			t.Fatal(err)
		}
		if err := schemas[c.tool].Validate(v); err != nil {
			t.Errorf("%s: structuredContent does not match the %s outputSchema: %v\n%s", c.name, c.tool, err, raw)
		}
		validated++
	}
	if validated < 15 || failures < 10 {
		t.Errorf("validated %d structured results and %d error results; the scenarios should give at least 15 and 10", validated, failures)
	}
}

// outputSchemas lists the tools and compiles each one's outputSchema.
func outputSchemas(t *testing.T, sess *gomcp.ClientSession) map[string]*jsonschema.Schema {
	t.Helper()
	list, err := sess.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*jsonschema.Schema{}
	c := jsonschema.NewCompiler()
	for _, tool := range list.Tools {
		raw, err := json.Marshal(tool.OutputSchema)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(raw)))
		if err != nil {
			t.Fatal(err)
		}
		url := fmt.Sprintf("mem://%s.json", tool.Name)
		if err := c.AddResource(url, doc); err != nil {
			t.Fatal(err)
		}
		if out[tool.Name], err = c.Compile(url); err != nil {
			t.Fatalf("%s: outputSchema does not compile: %v", tool.Name, err)
		}
	}
	if out["fetch"] == nil || out["quota_status"] == nil {
		t.Fatalf("tools/list lacks fetch or quota_status: %v", out)
	}
	return out
}
