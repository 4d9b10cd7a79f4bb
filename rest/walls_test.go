package rest_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcp-quota/mcp-quota/internal/leaktest"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/rest"
)

// awkwardSecret needs percent-encoding in a query, and is changed by form
// encoding, JSON escaping and HTML escaping.
const awkwardSecret = "zqx+9/8=x&y-UPSTREAM-41c7"

// TestWallsKeyNeverLeaves drives findings 1-5 of issue 13 through REST
// and MCP with a query credential that needs encoding, and scans every
// output channel and every file mcp-quota wrote for it in every form.
func TestWallsKeyNeverLeaves(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var landed []string // what the allowed host received
	allowed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		landed = append(landed, fmt.Sprintf("%s %s %v", r.Method, r.URL, r.Header))
		mu.Unlock()
		fmt.Fprint(w, "landed")
	}))
	t.Cleanup(allowed.Close)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(allowed.URL, "http://"))
	allowedURL := "http://localhost:" + port
	keys := testkit.Keys(
		testkit.Key{Name: "demo", BaseURL: "%[1]s/", SecretEnv: "UPSTREAM_SECRET", Auth: "query:api_key", MaxRate: 1000,
			AllowHosts: []string{"localhost:" + port}, Policies: testkit.Window(1000, time.Minute)},
		testkit.Key{Name: "bearer", BaseURL: "%[1]s/", SecretEnv: "UPSTREAM_SECRET", Auth: "bearer", MaxRate: 1000},
		testkit.Key{Name: "other", BaseURL: "%[1]s/", Auth: "none"},
	)
	cs := callersWith(map[string][]string{"sync": {"demo", "bearer"}, "agent": {"demo", "bearer"}})
	s := newStack(t, stackConfig{Upstream: &testkit.LeakyUpstream{AllowedURL: allowedURL}, Keys: keys, Callers: cs, Secret: awkwardSecret})

	var out strings.Builder
	record := func(what string, resp *http.Response, body []byte) {
		fmt.Fprintf(&out, "== %s\n%s %v\n%s\ntrailer %v\n", what, resp.Status, resp.Header, body, resp.Trailer)
	}
	for _, p := range []string{"/k/demo/v1/items?limit=5", "/k/bearer/v1/items?limit=5", "/k/demo/slash?limit=5",
		"/k/demo/via?limit=5", "/k/demo/to-allowed-with-key?limit=5", "/k/demo/v1/items?limit=5&page=2"} {
		resp, b := s.do(t, "GET", p, syncToken, nil)
		record("REST "+p, resp, b)
		if resp.StatusCode >= 500 {
			t.Errorf("GET %s: %d %s", p, resp.StatusCode, b)
		}
	}
	// A burst, so that calls are admitted from a lease and their outcomes
	// go through the process's journal (which is scanned below, if it is
	// still there).
	for range 40 {
		resp, b := s.do(t, "GET", "/k/demo/slash?limit=5", syncToken, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("burst: %d %s", resp.StatusCode, b)
		}
	}
	// The answers still say what they are, with the credential replaced
	// and a warning saying so.
	resp, b := s.do(t, "GET", "/k/bearer/v1/items?limit=5", syncToken, nil)
	if !strings.Contains(string(b), `"you_sent":"Bearer [redacted]"`) || !strings.Contains(resp.Header.Get(rest.WarningField), "the body") {
		t.Errorf("echoing body: %s, warning %q; want the Authorization replaced and a warning naming the body", b, resp.Header.Get(rest.WarningField))
	}
	if resp.ContentLength != int64(len(b)) {
		t.Errorf("Content-Length %d for a body of %d bytes", resp.ContentLength, len(b))
	}
	resp, _ = s.do(t, "GET", "/k/demo/v1/items?limit=5", syncToken, nil)
	if got := resp.Header.Get("Link"); got != `</k/demo/v1/items?limit=5&page=2>; rel="next"` {
		t.Errorf("Link %q; want the next page without the credential", got)
	}
	if w := resp.Header.Get(rest.WarningField); !strings.Contains(w, "X-Echo-Url") {
		t.Errorf("warning %q; want it to name X-Echo-Url", w)
	}

	// MCP over HTTP: fetch returns headers, next.path, body and text.
	ctx := context.Background()
	mc := mcpClient(t, s, agentToken)
	fetch := func(args map[string]any) *mcp.CallToolResult {
		req := mcp.CallToolRequest{}
		req.Params.Name, req.Params.Arguments = "fetch", args
		res, err := mc.CallTool(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		j, _ := json.Marshal(res)
		fmt.Fprintf(&out, "== MCP fetch %v\n%s\n", args, j)
		return res
	}
	res := fetch(map[string]any{"key": "demo", "path": "/v1/items?limit=5"})
	sc, _ := json.Marshal(res.StructuredContent)
	var got struct {
		Next     struct{ Path string } `json:"next"`
		Warnings []string              `json:"warnings"`
	}
	json.Unmarshal(sc, &got)
	if got.Next.Path != "/v1/items?limit=5&page=2" {
		t.Errorf("next.path %q; want /v1/items?limit=5&page=2", got.Next.Path)
	}
	if len(got.Warnings) == 0 || !strings.Contains(strings.Join(got.Warnings, " "), "credential") {
		t.Errorf("warnings %q; want one saying the credential was removed", got.Warnings)
	}
	fetch(map[string]any{"key": "demo", "path": "/v1/items?limit=5"}) // conditional, from the kept answer
	fetch(map[string]any{"key": "demo", "path": "/v1/items?limit=5", "start_index": 10})
	fetch(map[string]any{"key": "bearer", "path": "/v1/items?limit=5"})
	fetch(map[string]any{"key": "demo", "path": "/slash?limit=5"})

	for _, p := range []string{"/v1/activity?key=demo&limit=1000", "/v1/activity?key=bearer", "/v1/quota"} {
		resp, b := s.do(t, "GET", p, syncToken, nil)
		record("REST "+p, resp, b)
	}
	mu.Lock()
	channels := map[string]string{"answers": out.String(), "log": s.Log.String(), "allowed host": strings.Join(landed, "\n")}
	mu.Unlock()
	if !strings.Contains(channels["allowed host"], "/landing") {
		t.Errorf("the allowed host got nothing: the Referer case was not driven")
	}
	// (The test's own client follows the 302 it is given for the
	// redirect mcp-quota refused, with its own Referer.)
	if strings.Contains(channels["allowed host"], "api_key") || strings.Contains(channels["allowed host"], strings.TrimPrefix(s.UpstreamURL, "http://")) {
		t.Errorf("the allowed host got a credential parameter or a Referer naming the upstream:\n%s", channels["allowed host"])
	}
	for name, text := range leaktest.StateFiles(t, s.DBPath) {
		t.Logf("scanning %s (%d bytes)", name, len(text))
		channels[name] = text
	}
	if !strings.Contains(channels["state file"]+channels["state file-wal"], "/slash/") {
		t.Fatalf("the state file does not hold the redirect's attempt: the scan would prove nothing")
	}
	leaktest.Scan(t, awkwardSecret, channels)
}

// TestWallsStatusLine: an upstream that repeats its credential in its
// status line's reason phrase does not reach the REST caller with it.
func TestWallsStatusLine(t *testing.T) {
	t.Parallel()
	addr := rawUpstream(t, func(c io.Writer, req *http.Request) {
		body := "echo " + req.URL.RawQuery
		fmt.Fprintf(c, "HTTP/1.1 200 OK %s\r\nContent-Length: %d\r\nX-Reason: %s\r\n\r\n%s", req.URL.RawQuery, len(body), req.URL.RawQuery, body)
	})
	keys := testkit.Keys(
		testkit.Key{Name: "demo", BaseURL: "http://" + addr + "/", SecretEnv: "UPSTREAM_SECRET", Auth: "query:api_key", MaxRate: 1000},
		testkit.Key{Name: "other", BaseURL: "%[1]s", Auth: "none"},
	)
	s := newStack(t, stackConfig{Keys: keys, Secret: awkwardSecret})
	resp, b := s.do(t, "GET", "/k/demo/x", syncToken, nil)
	leaktest.Scan(t, awkwardSecret, map[string]string{"answer": fmt.Sprintf("%s %v %s", resp.Status, resp.Header, b)})
	if resp.StatusCode != 200 || string(b) != "echo api_key=[redacted]" {
		t.Errorf("%s %q; want 200 with the credential replaced", resp.Status, b)
	}
	_ = io.Discard
}

// mcpClient is an initialized MCP client of s's gateway with token.
func mcpClient(t *testing.T, s *stack, token string) *client.Client {
	t.Helper()
	ctx := context.Background()
	mc, err := client.NewStreamableHttpClient(s.URL+"/mcp", transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mc.Close() })
	if err := mc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "walls", Version: "1"}
	if _, err := mc.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	return mc
}

// callTool calls a tool and returns its result with the structured
// content as JSON — for an error result, which has none, its code (from
// _meta) and its sentence: {"code": "…", "message": "…"}.
func callTool(t *testing.T, mc *client.Client, name string, args map[string]any) (*mcp.CallToolResult, string) {
	t.Helper()
	req := mcp.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = name, args
	res, err := mc.CallTool(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError && res.StructuredContent == nil {
		e := map[string]any{}
		if res.Meta != nil {
			if m, ok := res.Meta.AdditionalFields["mcp-quota/error"].(map[string]any); ok {
				e["code"] = m["code"]
			}
		}
		for _, c := range res.Content {
			if tc, ok := c.(mcp.TextContent); ok {
				e["message"] = tc.Text
			}
		}
		sc, _ := json.Marshal(e)
		return res, string(sc)
	}
	sc, _ := json.Marshal(res.StructuredContent)
	return res, string(sc)
}

// TestWallsMalformedRequestCostsTheKeyNothing: a fetch whose header
// value holds CR/LF, and a REST request whose chunked body goes bad after
// the first MiB, are the caller's errors — badArguments / 400 — and,
// however often they come, the key's other callers are not refused.
func TestWallsMalformedRequestCostsTheKeyNothing(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackConfig{})
	mc := mcpClient(t, s, agentToken)
	for range 3 {
		res, sc := callTool(t, mc, "fetch", map[string]any{"key": "demo", "path": "/v1/participants?limit=1",
			"headers": map[string]any{"X-A": "1\r\nX-B: 2"}})
		if !res.IsError || !strings.Contains(sc, `"badArguments"`) || !strings.Contains(sc, "X-A") {
			t.Fatalf("CR/LF header: %s; want isError badArguments naming X-A", sc)
		}
	}
	if n := s.upstreamRequests(); n != 0 {
		t.Errorf("the upstream got %d requests for malformed fetches, want 0", n)
	}

	// A chunked body that goes bad after the first MiB, six times: more
	// than the circuit breaker's threshold of failures.
	chunk := strings.Repeat("x", 64<<10)
	for i := range 6 {
		conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST /k/demo/v1/echo HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nTransfer-Encoding: chunked\r\nPrefer: wait=0\r\n\r\n",
			strings.TrimPrefix(s.URL, "http://"), syncToken)
		for range 20 { // 1.25 MiB: past the replayable limit, so it streams
			fmt.Fprintf(conn, "%x\r\n%s\r\n", len(chunk), chunk)
		}
		io.WriteString(conn, "zz-not-a-chunk-size\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), `"badRequest"`) {
				t.Errorf("bad chunked body %d: %d %s; want 400 badRequest", i, resp.StatusCode, b)
			}
		}
		conn.Close()
	}

	// Every other caller of the key still gets through.
	resp, b := s.do(t, "GET", "/k/demo/v1/participants?limit=1", syncToken, nil, "Prefer", "wait=0")
	if resp.StatusCode != http.StatusOK {
		t.Errorf("after the malformed requests, another caller got %d %s; want 200", resp.StatusCode, b)
	}
	res, sc := callTool(t, mc, "fetch", map[string]any{"key": "demo", "path": "/v1/participants?limit=2", "max_wait_s": 0})
	if res.IsError || !strings.Contains(sc, `"status":200`) {
		t.Errorf("after the malformed requests, a good fetch got %s", sc)
	}
}

// TestWallsStateUnavailable: when mcp-quota's own state file fails, REST
// answers 503 stateUnavailable (not 502 upstreamUnavailable), MCP an
// isError stateUnavailable, /healthz 503 — and nothing is sent upstream.
func TestWallsStateUnavailable(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackConfig{})
	mc := mcpClient(t, s, agentToken)
	if resp, b := s.do(t, "GET", "/healthz", "", nil); resp.StatusCode != 200 {
		t.Fatalf("healthz of a sound state: %d %s", resp.StatusCode, b)
	}
	s.DB.Close() // the state file is gone from under the server
	before := s.upstreamRequests()
	resp, b := s.do(t, "GET", "/k/demo/v1/participants?limit=1", syncToken, nil, "Prefer", "wait=0")
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), `"stateUnavailable"`) {
		t.Errorf("REST with a failed state: %d %s; want 503 stateUnavailable", resp.StatusCode, b)
	}
	res, sc := callTool(t, mc, "fetch", map[string]any{"key": "demo", "path": "/v1/participants?limit=1", "max_wait_s": 0})
	if !res.IsError || !strings.Contains(sc, `"stateUnavailable"`) {
		t.Errorf("fetch with a failed state: %s; want isError stateUnavailable", sc)
	}
	res, sc = callTool(t, mc, "quota_status", map[string]any{})
	if !res.IsError || !strings.Contains(sc, `"stateUnavailable"`) {
		t.Errorf("quota_status with a failed state: %s; want isError stateUnavailable", sc)
	}
	if resp, b := s.do(t, "GET", "/healthz", "", nil); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), `"stateUnavailable"`) {
		t.Errorf("healthz with a failed state: %d %s; want 503 stateUnavailable", resp.StatusCode, b)
	}
	if n := s.upstreamRequests() - before; n != 0 {
		t.Errorf("the upstream got %d requests while the state had failed, want 0", n)
	}
}

// brokenUpstream answers in the ways an answer can fail: never, cut by a
// reset mid-body, a binary body cut short, a trickle, a false huge
// Content-Length.
func brokenUpstream(t *testing.T) http.Handler {
	hijack := func(w http.ResponseWriter) net.Conn {
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return nil
		}
		return c
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/never":
			<-r.Context().Done()
		case "/reset":
			c := hijack(w)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"items\":[1,2,3")
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0) // a reset, not a clean close
			}
			c.Close()
		case "/binary-short":
			c := hijack(w)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 1000\r\n\r\n%s", strings.Repeat("\x00\x01", 50))
			c.Close()
		case "/trickle":
			w.Header().Set("Content-Type", "text/plain")
			rc := http.NewResponseController(w)
			for {
				if _, err := io.WriteString(w, "."); err != nil {
					return
				}
				rc.Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(20 * time.Millisecond): // the upstream's pace, not the test's
				}
			}
		case "/huge-length":
			c := hijack(w)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 10000000000\r\n\r\n%s", "twenty bytes of body")
			c.Close()
		case "/short-length":
			c := hijack(w)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n%s", "twenty bytes of body")
			c.Close()
		}
	})
}

// TestWallsBrokenAnswersNamed: in MCP, an upstream that never answers, a
// reset mid-body, a binary body cut short and a trickle that outlasts the
// answer's bound are each named for what happened; on REST, a false
// Content-Length is never passed on.
func TestWallsBrokenAnswersNamed(t *testing.T) {
	t.Parallel()
	keys := testkit.Keys(
		testkit.Key{Name: "demo", BaseURL: "%[1]s/", SecretEnv: "UPSTREAM_SECRET", MaxRate: 1000, Policies: testkit.Window(1000, time.Minute)},
		testkit.Key{Name: "other", BaseURL: "%[1]s/", Auth: "none"},
	)
	// The answer's bound must leave the trickle's headers time to arrive
	// on a loaded machine (a 300 ms bound was missed there, and the
	// trickle was reported as never answering); /never and /trickle each
	// take the whole bound.
	s := newStack(t, stackConfig{Upstream: brokenUpstream(t), Keys: keys, AnswerTimeout: 1500 * time.Millisecond,
		Callers: callersWith(map[string][]string{"sync": {"demo", "other"}, "agent": {"demo", "other"}})})
	mc := mcpClient(t, s, agentToken)
	type want struct {
		code      string // of an isError result; "" for a result
		truncated bool
		says      string
	}
	for path, w := range map[string]want{
		"/never":        {code: "upstreamTimeout", says: "did not answer within"},
		"/reset":        {truncated: true, says: "connection broke after 15 bytes of the body of the 1000 it announced"},
		"/binary-short": {truncated: true, says: "connection broke after 100 bytes of the body of the 1000"},
		"/trickle":      {truncated: true, says: "still sending the body"},
	} {
		t.Run(strings.TrimPrefix(path, "/"), func(t *testing.T) {
			key := "demo"
			if path == "/never" {
				key = "other" // a timeout is the upstream's failure: its backoff must not pause the others
			}
			res, sc := callTool(t, mc, "fetch", map[string]any{"key": key, "path": path, "max_wait_s": 0})
			text := ""
			for _, c := range res.Content {
				if tc, ok := c.(mcp.TextContent); ok {
					text += tc.Text
				}
			}
			if w.code != "" {
				if !res.IsError || !strings.Contains(sc, `"`+w.code+`"`) || !strings.Contains(sc, w.says) {
					t.Errorf("%s: %s; want isError %s saying %q", path, sc, w.code, w.says)
				}
				return
			}
			if res.IsError || !strings.Contains(sc, `"truncated":true`) || !strings.Contains(sc, w.says) || !strings.Contains(text, w.says) {
				t.Errorf("%s: %s\n%s\nwant a result, truncated, saying %q in both", path, sc, text, w.says)
			}
			if strings.Contains(sc, "larger than mcp-quota reads") {
				t.Errorf("%s is reported as a size cut: %s", path, sc)
			}
		})
	}

	t.Run("REST false length", func(t *testing.T) {
		req, _ := http.NewRequest("GET", s.URL+"/k/demo/huge-length", nil)
		req.Header.Set("Authorization", "Bearer "+syncToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.ContentLength == 10000000000 || resp.Header.Get("Content-Length") != "" {
			t.Errorf("the false Content-Length was passed on: %d %q", resp.ContentLength, resp.Header.Get("Content-Length"))
		}
		if rerr == nil {
			t.Errorf("the cut body (%q) ended as if whole; want the exchange to end with an error", b)
		}
		r2, b2 := s.do(t, "GET", "/k/demo/short-length", syncToken, nil)
		if r2.StatusCode != http.StatusBadGateway || !strings.Contains(string(b2), "broke off after 20 bytes of the 100 it announced") {
			t.Errorf("a small body cut short: %d %s; want 502 naming it", r2.StatusCode, b2)
		}
	})
}

// TestWallsOwnKeysOnly: unknownKey and the fetch description name only
// the keys the caller may use (issue 13: they listed every key).
func TestWallsOwnKeysOnly(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackConfig{}) // keys demo and other; the agent may use demo only
	mc := mcpClient(t, s, agentToken)
	res, sc := callTool(t, mc, "quota_status", map[string]any{"key": "nope"})
	if !res.IsError || !strings.Contains(sc, "unknownKey") || strings.Contains(sc, "other") {
		t.Errorf("quota_status of an unknown key: %s; want unknownKey naming only the caller's keys", sc)
	}
	for _, name := range []string{"nope", ""} {
		res, sc := callTool(t, mc, "fetch", map[string]any{"key": name, "path": "/v1/participants"})
		if name == "nope" && (!res.IsError || !strings.Contains(sc, "unknownKey")) {
			t.Errorf("key %q: %s; want unknownKey", name, sc)
		}
		if strings.Contains(sc, "other") {
			t.Errorf("key %q: %s names a key the caller may not use", name, sc)
		}
	}
	tl, err := mc.ListTools(context.Background(), mcp.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tl.Tools {
		if tool.Name == "fetch" && (strings.Contains(tool.Description, "other") || !strings.Contains(tool.Description, "demo")) {
			t.Errorf("fetch description for the agent: %q; want demo and not other", tool.Description)
		}
	}
	resp, b := s.do(t, "GET", "/k/nope/x", syncToken, nil)
	if resp.StatusCode != 404 || strings.Contains(string(b), "other") {
		t.Errorf("REST unknown key: %d %s; want 404 naming only the caller's keys", resp.StatusCode, b)
	}
}

// TestWallsRetryAfterDecided: an upstream's Retry-After is not passed on
// as it came; REST callers get what mcp-quota decided (issue 13: invalid
// values went through verbatim).
func TestWallsRetryAfterDecided(t *testing.T) {
	t.Parallel()
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", r.URL.Query().Get("ra"))
		status := http.StatusOK
		if r.URL.Query().Has("refuse") {
			status = http.StatusTooManyRequests
		}
		w.WriteHeader(status)
	})
	for _, tc := range []struct {
		query string
		want  func(string) bool
		says  string
	}{
		{"ra=soon", func(v string) bool { return v == "" }, "none: a 200 that mcp-quota set no wait for"},
		{"ra=-5&refuse", func(v string) bool { n, err := strconv.Atoi(v); return v == "" || err == nil && n >= 1 },
			"what mcp-quota decided: none, or its backoff in whole seconds"},
		{"ra=Wed,%2021%20Oct%202015%2007:28:00%20GMT&refuse", func(v string) bool { return v == "" || !strings.Contains(v, "2015") },
			"not a date in the past"},
		{"ra=7&refuse", func(v string) bool { n, err := strconv.Atoi(v); return err == nil && n >= 7 && n <= 8 }, "7 or 8 (the upstream's wait, jittered up)"},
	} {
		s := newStack(t, stackConfig{Upstream: up}) // a key no earlier answer paused
		resp, _ := s.do(t, "GET", "/k/demo/x?"+tc.query, syncToken, nil, "Prefer", "wait=0")
		if got := resp.Header.Get("Retry-After"); !tc.want(got) {
			t.Errorf("upstream Retry-After from %q: the caller got %q; want %s", tc.query, got, tc.says)
		}
	}
}

// TestWallsRedirectToOtherScheme: a same-host redirect to another scheme
// (gopher://, or https:// from an http base) is refused before anything
// is dialled: the 3xx comes back as it came, and the key is not blamed.
func TestWallsRedirectToOtherScheme(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	conns := 0
	var host string
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/gopher":
			http.Redirect(w, r, "gopher://"+host+"/x", http.StatusFound)
		case "/https":
			http.Redirect(w, r, "https://"+host+"/x", http.StatusFound)
		}
	}))
	up.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateNew {
			mu.Lock()
			conns++
			mu.Unlock()
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	host = strings.TrimPrefix(up.URL, "http://")
	keys := testkit.Keys(
		testkit.Key{Name: "demo", BaseURL: up.URL + "/", SecretEnv: "UPSTREAM_SECRET", MaxRate: 1000},
		testkit.Key{Name: "other", BaseURL: "%[1]s", Auth: "none"},
	)
	s := newStack(t, stackConfig{Keys: keys})
	for _, p := range []string{"/gopher", "/https", "/gopher", "/https", "/gopher", "/https"} {
		resp, b := s.raw(t, "GET", "/k/demo"+p, "Authorization: Bearer "+syncToken, "Prefer: wait=0")
		if resp.StatusCode != http.StatusFound {
			t.Errorf("%s: %d %s; want the 302 as it came", p, resp.StatusCode, b)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if conns != 1 {
		t.Errorf("the upstream's address saw %d connections; want 1 (the redirects were not followed)", conns)
	}
}

// TestWallsStreamedBodyScrubbed: a streamed REST answer (chunked, larger
// than the lookahead, the credential split across the upstream's
// flushes, and an event stream) reaches the caller without the
// credential, with a trailer saying it was removed.
func TestWallsStreamedBodyScrubbed(t *testing.T) {
	t.Parallel()
	enc := url.QueryEscape(awkwardSecret)
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.URL.Path == "/events" {
			w.Header().Set("Content-Type", "text/event-stream")
		}
		io.WriteString(w, strings.Repeat("padding ", 300<<10/8))
		rc.Flush()
		io.WriteString(w, "data: "+enc[:7])
		rc.Flush()
		io.WriteString(w, enc[7:]+"\n\n")
		rc.Flush()
		io.WriteString(w, "data: "+awkwardSecret[:3])
		rc.Flush()
		io.WriteString(w, awkwardSecret[3:]+"\n\n")
	})
	keys := testkit.Keys(
		testkit.Key{Name: "demo", BaseURL: "%[1]s/", SecretEnv: "UPSTREAM_SECRET", Auth: "query:api_key", MaxRate: 1000},
		testkit.Key{Name: "other", BaseURL: "%[1]s", Auth: "none"},
	)
	s := newStack(t, stackConfig{Upstream: up, Keys: keys, Secret: awkwardSecret})
	for _, p := range []string{"/k/demo/big", "/k/demo/events"} {
		resp, b := s.do(t, "GET", p, syncToken, nil)
		leaktest.Scan(t, awkwardSecret, map[string]string{p: fmt.Sprintf("%v %s %v", resp.Header, b, resp.Trailer)})
		if n := strings.Count(string(b), "data: [redacted]\n\n"); n != 2 {
			t.Errorf("%s: %d events with the credential replaced, want 2", p, n)
		}
		if !strings.Contains(resp.Trailer.Get(rest.WarningField), "the body") {
			t.Errorf("%s: trailer %v; want %s naming the body", p, resp.Trailer, rest.WarningField)
		}
	}
}

// TestWallsOldRowsScrubbedOnTheWayOut: activity an older mcp-quota
// recorded with the credential in its target is shown without it.
func TestWallsOldRowsScrubbedOnTheWayOut(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackConfig{})
	err := s.DB.Update(context.Background(), func(tx ledger.Tx) error {
		_, err := tx.InsertAttempt(ledger.Attempt{CallID: "old", Attempt: 1, Key: "demo", Caller: "sync", Transport: "rest", Method: "GET",
			Target: "/slash/?api_key=" + url.QueryEscape(upstreamSecret), State: ledger.Confirmed, Status: 200,
			Reason: reason.Reason{Kind: reason.Said, Said: "redirected to /slash/?api_key=" + upstreamSecret}, At: time.Now()})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	resp, b := s.do(t, "GET", "/v1/activity?key=demo", syncToken, nil)
	if resp.StatusCode != 200 || !strings.Contains(string(b), "/slash/?api_key=[redacted]") {
		t.Errorf("activity: %d %s; want the old row with the credential replaced", resp.StatusCode, b)
	}
	leaktest.Scan(t, upstreamSecret, map[string]string{"activity": string(b)})
	mc := mcpClient(t, s, agentToken)
	rr, err := mc.ReadResource(context.Background(), mcp.ReadResourceRequest{Params: mcp.ReadResourceParams{URI: "quota://activity/demo"}})
	if err != nil {
		t.Fatal(err)
	}
	j, _ := json.Marshal(rr)
	if !strings.Contains(string(j), "[redacted]") {
		t.Errorf("activity resource: %s; want the old row with the credential replaced", j)
	}
	leaktest.Scan(t, upstreamSecret, map[string]string{"activity resource": string(j)})
}

// TestWallsUpstreamErrorTextIsBounded: an answer Go's client refuses (a
// header line of almost 1 MB of control bytes) gives an error that
// quotes the line; neither the caller's problem nor the activity's reason
// carries more than a bounded part of it.
func TestWallsUpstreamErrorTextIsBounded(t *testing.T) {
	t.Parallel()
	junk := strings.Repeat("\x1b[31mjunk", 80000)
	addr := rawUpstream(t, func(c io.Writer, _ *http.Request) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nX-Junk: %s\r\nContent-Length: 2\r\n\r\nok", junk)
	})
	keys := testkit.Keys(
		testkit.Key{Name: "demo", BaseURL: "http://" + addr + "/", Auth: "none", MaxRate: 1000},
		testkit.Key{Name: "other", BaseURL: "%[1]s", Auth: "none"},
	)
	s := newStack(t, stackConfig{Keys: keys})
	resp, b := s.do(t, "POST", "/k/demo/x", syncToken, nil) // never retried
	if resp.StatusCode != http.StatusBadGateway || len(b) > 4000 || !strings.Contains(string(b), "junk") {
		t.Errorf("%s, %d bytes (%.300q); want a 502 that quotes a bounded part of the upstream's error", resp.Status, len(b), b)
	}
	_, a := s.do(t, "GET", "/v1/activity?key=demo", syncToken, nil)
	if len(a) > 8000 || !strings.Contains(string(a), "junk") {
		t.Errorf("the activity: %d bytes (%.300q); want the failed attempt with a bounded reason", len(a), a)
	}
}

// rawUpstream serves, on loopback, an upstream that reads each request
// and writes its answer byte by byte with answer (one a Go server would
// not send), and returns its address.
func rawUpstream(t *testing.T, answer func(c io.Writer, req *http.Request)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				answer(c, req)
			}()
		}
	}()
	return ln.Addr().String()
}
