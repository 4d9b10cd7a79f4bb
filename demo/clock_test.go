package demo_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// t0 is when every test's clock starts.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// testClock is a hand-driven clock for Config.Clock, set relative to t0.
type testClock struct{ *testkit.Clock }

func newClock() *testClock { return &testClock{testkit.NewClock(t0)} }

// Set moves the clock to t0+d.
func (c *testClock) Set(d time.Duration) { c.Clock.Set(t0.Add(d)) }

// response is what a test looks at in an answer.
type response struct {
	status int
	header http.Header
	body   string
}

// call sends one request to api in process, with "Bearer token" unless
// token is empty, and extra header fields given as name, value pairs.
func call(t *testing.T, api http.Handler, method, target, token string, header ...string) response {
	t.Helper()
	return send(t, api, method, target, token, "", header...)
}

func send(t *testing.T, api http.Handler, method, target, token, body string, header ...string) response {
	t.Helper()
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	api.ServeHTTP(rec, req)
	res := rec.Result()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: string(b)}
}

// get sends n GET /v1/echo calls and fails unless all get want.
func get(t *testing.T, api http.Handler, token string, n, want int) response {
	t.Helper()
	var res response
	for i := range n {
		res = call(t, api, http.MethodGet, "/v1/echo", token)
		if res.status != want {
			t.Fatalf("call %d of %d: got status %d, want %d (body %s)", i+1, n, res.status, want, res.body)
		}
	}
	return res
}

func decode(t *testing.T, body string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("decoding %q: %v", body, err)
	}
}

func newAPI(c *testClock, cfg demo.Config) *demo.API {
	cfg.Clock = c
	return demo.New(cfg)
}
