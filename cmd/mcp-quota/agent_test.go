package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
)

// TestToolBadInput: every mistake an agent can make gets an isError result
// with a stable code and a sentence it can act on; nothing crashes and no
// secret shows.
func TestToolBadInput(t *testing.T) {
	t.Parallel()
	_, url := upstreamAPI(t, demo.Config{})
	// A second key whose credential's variable is not set.
	s := newSetup(t, demoKey(url, 120, time.Minute), noSecretKey(url))
	sess := s.stdioSession(t, nil)
	tests := []struct {
		name string
		args map[string]any
		code string
		says string
	}{
		{"unknown key", map[string]any{"key": "nope", "path": "/v1/participants"}, "unknownKey", `configured keys are demo, nosecret`},
		{"no key with two configured", map[string]any{"path": "/v1/participants"}, "unknownKey", "name one of demo, nosecret"},
		{"dot-dot", map[string]any{"key": "demo", "path": "/v1/../../etc/passwd"}, "badPath", "'..' segments are not allowed"},
		{"encoded dot-dot", map[string]any{"key": "demo", "path": "/v1/%2e%2e/admin"}, "badPath", "encoded"},
		{"absolute URL", map[string]any{"key": "demo", "path": "http://169.254.169.254/latest"}, "badPath", "absolute URLs are not allowed"},
		{"scheme-relative", map[string]any{"key": "demo", "path": "//evil.example/x"}, "badPath", "scheme-relative"},
		{"userinfo", map[string]any{"key": "demo", "path": "/@evil.example"}, "badPath", "'@'"},
		{"backslash", map[string]any{"key": "demo", "path": `/v1\..\x`}, "badPath", "backslashes"},
		{"missing path", map[string]any{"key": "demo"}, "badArguments", "path is required"},
		{"wrong type", map[string]any{"key": "demo", "path": 5}, "badArguments", "path must be a string"},
		{"unknown argument", map[string]any{"key": "demo", "path": "/", "url": "http://x"}, "badArguments", "url is not an argument of fetch"},
		{"query of numbers", map[string]any{"key": "demo", "path": "/", "query": map[string]any{"limit": 5}}, "badArguments", "query must be an object of strings"},
		{"method not open", map[string]any{"key": "demo", "path": "/v1/participants", "method": "DELETE"}, "methodNotAllowed", "allows only GET, HEAD"},
		{"negative wait", map[string]any{"key": "demo", "path": "/", "max_wait_s": -1}, "badArguments", "max_wait_s"},
		{"missing secret", map[string]any{"key": "nosecret", "path": "/v1/participants"}, "noCredential", "UNSET_VARIABLE_FOR_TEST is not set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, out := call(t, sess, "fetch", tt.args)
			if !res.IsError {
				t.Fatalf("result is not an error: %s", text(res))
			}
			if got := errorCode(res); got != tt.code {
				t.Errorf("code = %q, want %s (result: %s)", got, tt.code, text(res))
			}
			if res.StructuredContent != nil {
				t.Errorf("an error result carries structuredContent %v; a client validates it against the success schema", out)
			}
			if !strings.Contains(text(res), tt.says) {
				t.Errorf("text %q does not say %q", text(res), tt.says)
			}
			if n := strings.Count(strings.ToLower(text(res)), "give a path below"); n > 1 {
				t.Errorf("text %q gives the same advice %d times", text(res), n)
			}
			if strings.Contains(fmt.Sprint(out)+text(res), upstreamSecret) {
				t.Error("result contains the upstream secret")
			}
		})
	}
}

// TestWaitWithProgress: a call that must wait for the budget waits (within
// max_wait_s), sends progress notifications saying what it waits for, and
// then succeeds.
func TestWaitWithProgress(t *testing.T) {
	t.Parallel()
	api, url := upstreamAPI(t, demo.Config{})
	const window = 4 * time.Second
	s := newSetup(t, demoKey(url, 2, window))
	progress := make(chan string, 100)
	opts := &gomcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, r *gomcp.ProgressNotificationClientRequest) {
		select {
		case progress <- r.Params.Message:
		default:
		}
	}}
	base, _ := s.serve(t)
	sess := httpSession(t, base, agentToken, opts)
	// The window opens no earlier than the first call: the third call
	// waits at least what is left of it when it starts, however long the
	// first two took on a busy machine.
	first := time.Now()
	for i := range 2 {
		if res, _ := call(t, sess, "fetch", map[string]any{"path": fmt.Sprintf("/v1/participants/p-%06d", i+1)}); res.IsError {
			t.Fatalf("call %d: %s", i, text(res))
		}
	}
	params := &gomcp.CallToolParams{Name: "fetch", Arguments: map[string]any{"path": "/v1/participants/p-000003", "max_wait_s": 10}}
	params.SetProgressToken("wait-1")
	start := time.Now()
	left := window - start.Sub(first)
	if left <= 0 {
		t.Fatalf("the first two calls took %v, the whole %v window: nothing is left to wait for", start.Sub(first), window)
	}
	res, err := sess.CallTool(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	out := structured(t, res)
	if res.IsError || out["status"] != float64(200) {
		t.Fatalf("the waiting call did not succeed: %s", text(res))
	}
	// waited_s counts from the call's arrival in mcp-quota, a little after
	// start: half a second is left for that on a busy machine.
	if w := out["waited_s"].(float64); w <= 0 || w < left.Seconds()-0.5 {
		t.Errorf("waited_s = %v after %v; want at least the %v left of the window", w, time.Since(start), left.Round(time.Millisecond))
	}
	if got := len(api.Stats(upstreamSecret).Accepted); got != 3 {
		t.Errorf("upstream accepted %d, want 3", got)
	}
	// Notifications are delivered asynchronously: they may arrive after
	// the result.
	select {
	case msg := <-progress:
		if !strings.Contains(msg, "waiting for key 'demo'") || !strings.Contains(msg, "policy 'default'") {
			t.Errorf("progress message %q does not say what it waits for", msg)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no progress notification while waiting")
	}
}

// TestPauseSendsNothing: when the wait is longer than max_wait_s, the
// answer is a pause (isError, nothing sent), with the seconds to wait.
// The window is 30 s, so that the wait (the window, plus a margin that
// grows with how late sends leave on a loaded machine, less the time the
// two calls took) is always within what max_wait_s may ask (60 s), and
// the pause offers it; with a 60-s window a loaded run waited 61 s.
func TestPauseSendsNothing(t *testing.T) {
	api, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 2, 30*time.Second))
	sess := s.stdioSession(t, nil)
	for i := range 2 {
		call(t, sess, "fetch", map[string]any{"path": fmt.Sprintf("/v1/participants/p-%06d", i+1)})
	}
	res, out := call(t, sess, "fetch", map[string]any{"path": "/v1/participants/p-000003", "max_wait_s": 0})
	if !res.IsError || out["sent"] != false {
		t.Fatalf("want a pause with nothing sent, got %s", text(res))
	}
	a := out["advice"].(map[string]any)
	wait := a["retry_after_s"].(float64)
	if a["action"] != "pause" || wait < 25 || wait > 35 {
		t.Errorf("advice = %v, want pause for about 30 s", a)
	}
	first := strings.SplitN(text(res), "\n", 2)[0]
	if !strings.HasPrefix(first, "Paused: key 'demo'") || !strings.Contains(first, "nothing was sent") || !strings.Contains(first, fmt.Sprintf("max_wait_s: %d", int(wait))) {
		t.Errorf("first line %q does not say paused, nothing sent, and what to do", first)
	}
	if got := api.Stats(upstreamSecret).Requests; got != 2 {
		t.Errorf("upstream saw %d requests, want 2: a pause sends nothing", got)
	}
}

// TestLoopGuard: 20 identical fetches of an unchanging page stop spending
// quota, and the results say why and what to do instead.
func TestLoopGuard(t *testing.T) {
	api, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	sess := s.stdioSession(t, nil)
	var fromCache, notModified int
	var last map[string]any
	for range 20 {
		res, out := call(t, sess, "fetch", map[string]any{"path": "/v1/participants?limit=10"})
		if res.IsError {
			t.Fatalf("fetch: %s", text(res))
		}
		if out["from_cache"] == true {
			fromCache++
		}
		if out["not_modified"] == true {
			notModified++
		}
		last = out
	}
	spent := len(api.Stats(upstreamSecret).Accepted)
	if spent > 6 {
		t.Errorf("20 identical fetches spent %d calls of quota; the loop guard should stop at 6", spent)
	}
	if fromCache < 14 {
		t.Errorf("%d answers came from the kept copy, want at least 14", fromCache)
	}
	if notModified == 0 {
		t.Error("no 304: repeated fetches should be conditional requests")
	}
	a := last["advice"].(map[string]any)
	reason := a["reason"].(string)
	if a["action"] != "slow_down" || !strings.Contains(reason, "did not change") || !strings.Contains(reason, "updatedSince") || !strings.Contains(reason, "webhooks") {
		t.Errorf("advice = %v; want slow_down naming the unchanged answer and the better ways", a)
	}
	if body := last["body"].(string); !strings.Contains(body, "p-000001") {
		t.Errorf("the kept answer lost its body: %q", body)
	}
}

// TestLoopGuardIsPerCaller: a sync job that polls a page over REST is not
// the agent repeating itself. The agent's own fetches of that page go
// upstream until it has repeated itself past the limit, and the advice
// counts its own repeats only.
func TestLoopGuardIsPerCaller(t *testing.T) {
	api, url := upstreamAPI(t, demo.Config{})
	// The sync job polls as fast as its calls come back (MaxRate), not
	// 100 ms apart: its pace is not what this test is about.
	k := demoKey(url, 120, time.Minute)
	k.MaxRate = 1000
	s := newSetup(t, k)
	base, _ := s.serve(t)
	for range 10 {
		resp := get(t, base+"/k/demo/v1/participants?limit=10", syncToken)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("REST: got %s", resp.Status)
		}
	}
	sess := httpSession(t, base, agentToken, nil)
	for i := 1; i <= 3; i++ {
		before := api.Stats(upstreamSecret).Requests
		res, out := call(t, sess, "fetch", map[string]any{"path": "/v1/participants?limit=10"})
		if after := api.Stats(upstreamSecret).Requests; res.IsError || out["from_cache"] == true || after != before+1 {
			t.Errorf("agent fetch %d: from_cache=%v, upstream requests %d→%d; want it sent: the sync job's polls are not its repeats",
				i, out["from_cache"], before, after)
		}
		reason := out["advice"].(map[string]any)["reason"].(string)
		if strings.Contains(reason, "same request") && !strings.Contains(reason, fmt.Sprintf("same request %d times", i)) {
			t.Errorf("agent fetch %d: advice %q counts the sync job's requests as the agent's", i, reason)
		}
	}
}

// TestConditionalRequest: the second fetch of a URL sends If-None-Match,
// gets a 304 (which counts), and shows the kept body.
func TestConditionalRequest(t *testing.T) {
	api, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	sess := s.stdioSession(t, nil)
	_, first := call(t, sess, "fetch", map[string]any{"path": "/v1/participants/p-000042"})
	res, second := call(t, sess, "fetch", map[string]any{"path": "/v1/participants/p-000042"})
	if res.IsError || second["not_modified"] != true || second["status"] != float64(304) {
		t.Fatalf("second fetch = %v; want a 304 answered from the kept body", second)
	}
	if second["body"] != first["body"] || !strings.Contains(second["body"].(string), "p-000042") {
		t.Errorf("304 body %q, want the kept %q", second["body"], first["body"])
	}
	if q := second["quota"].(map[string]any); q["remaining"] != float64(118) {
		t.Errorf("quota after a 304 = %v; a 304 still counts: want 118 remaining", q)
	}
	if got := len(api.Stats(upstreamSecret).Accepted); got != 2 {
		t.Errorf("upstream counted %d calls, want 2", got)
	}
}

// TestPagingLargeBody reads a 1 MB body in pages with start_index: the
// first page fetches, the rest page through the stored copy without
// spending quota, and together they are the whole body.
func TestPagingLargeBody(t *testing.T) {
	t.Parallel()
	api, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	sess := s.stdioSession(t, nil)
	const size = 1 << 20
	var whole strings.Builder
	start, pages := 0, 0
	for {
		res, out := call(t, sess, "fetch", map[string]any{"path": fmt.Sprintf("/v1/report?bytes=%d", size), "start_index": start, "max_length": 25000})
		if res.IsError {
			t.Fatalf("page at %d: %s", start, text(res))
		}
		pages++
		body := out["body"].(string)
		if out["truncated"] == true {
			next := int(out["next_start_index"].(float64))
			marker := strings.LastIndex(body, "\n[truncated")
			if marker < 0 {
				t.Fatalf("a cut page has no marker")
			}
			whole.WriteString(body[:marker])
			start = next
			continue
		}
		whole.WriteString(body)
		if total := int(out["total_length"].(float64)); total != size {
			t.Errorf("total_length = %d, want %d", total, size)
		}
		break
	}
	if pages != 42 {
		t.Errorf("%d pages, want 42 of at most 25000 characters", pages)
	}
	if !json.Valid([]byte(whole.String())) || whole.Len() != size {
		t.Errorf("the pages put together are %d bytes (valid JSON: %v); want the whole %d-byte document", whole.Len(), json.Valid([]byte(whole.String())), size)
	}
	if got := len(api.Stats(upstreamSecret).Accepted); got != 1 {
		t.Errorf("paging spent %d calls, want 1", got)
	}
}

// TestHTTPWalls: MCP over HTTP refuses a missing or wrong token and a
// foreign Origin, on every method.
func TestHTTPWalls(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	base, _ := s.serve(t)
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	tests := []struct {
		name   string
		method string
		header map[string]string
		status int
	}{
		{"no token", http.MethodPost, nil, http.StatusUnauthorized},
		{"wrong token", http.MethodPost, map[string]string{"Authorization": "Bearer not-a-token-of-ours"}, http.StatusUnauthorized},
		{"foreign origin", http.MethodPost, map[string]string{"Authorization": "Bearer " + agentToken, "Origin": "https://evil.example"}, http.StatusForbidden},
		{"foreign origin on GET", http.MethodGet, map[string]string{"Authorization": "Bearer " + agentToken, "Origin": "https://evil.example"}, http.StatusForbidden},
		{"rebinding host", http.MethodPost, map[string]string{"Authorization": "Bearer " + agentToken, "Host": "evil.example"}, http.StatusForbidden},
		{"good", http.MethodPost, map[string]string{"Authorization": "Bearer " + agentToken}, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), tt.method, base+"/mcp", strings.NewReader(initialize))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			if h, ok := tt.header["Host"]; ok {
				req.Host = h
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Errorf("status = %d, want %d", resp.StatusCode, tt.status)
			}
		})
	}
}

// TestWarningsReachTheAgent: a refusal no announced limit explains is a
// hidden limit; the agent hears of it through an MCP logging notification
// (it asked for warnings) and in the result.
func TestWarningsReachTheAgent(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{Mode: demo.Silent, Quota: 1, Window: time.Minute})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	cmd, stderr := s.command(t, "stdio")
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); cmd.Wait() }()
	send := func(msg string) { io.WriteString(in, msg+"\n") }
	// Messages are read in the background: a notification may arrive
	// before or after the result it belongs to.
	msgs := make(chan map[string]any, 100)
	go func() {
		lines := bufio.NewScanner(out)
		lines.Buffer(nil, 1<<20)
		for lines.Scan() {
			var m map[string]any
			json.Unmarshal(lines.Bytes(), &m)
			msgs <- m
		}
		close(msgs)
	}()
	timeout := time.After(30 * time.Second)
	next := func() map[string]any {
		select {
		case m, ok := <-msgs:
			if !ok {
				t.Fatalf("stdout ended; stderr:\n%s", stderr.String())
			}
			return m
		case <-timeout:
			t.Fatalf("no message in time; stderr:\n%s", stderr.String())
		}
		return nil
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	next()
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	send(`{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"warning"}}`)
	next()
	send(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"fetch","arguments":{"path":"/v1/participants/p-000001"}}}`)
	next()
	send(`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"fetch","arguments":{"path":"/v1/participants/p-000002","max_wait_s":0}}}`)
	var notified, answered bool
	for !answered || !notified {
		m := next()
		switch {
		case m["method"] == "notifications/message":
			params := m["params"].(map[string]any)
			if params["level"] == "warning" && strings.Contains(fmt.Sprint(params["data"]), "never announced") {
				notified = true
			}
		case m["id"] == float64(4):
			answered = true
			res := m["result"].(map[string]any)
			sc := res["structuredContent"].(map[string]any)
			if sc["status"] != float64(429) || res["isError"] == true {
				t.Errorf("a 429 from upstream must be a normal result with its status: %v", res)
			}
			if w, _ := sc["warnings"].([]any); len(w) == 0 {
				t.Errorf("the result carries no warning: %v", sc)
			}
		}
	}
	if !notified {
		t.Error("no logging notification about the hidden limit")
	}
}

// TestActivityResource reads the key's activity as an MCP resource.
func TestActivityResource(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	sess := s.stdioSession(t, nil, "--caller", "resource-test")
	call(t, sess, "fetch", map[string]any{"path": "/v1/participants/p-000007"})
	res, err := sess.ReadResource(t.Context(), &gomcp.ReadResourceParams{URI: "quota://activity/demo"})
	if err != nil {
		t.Fatal(err)
	}
	var page struct { // the shape of GET /v1/activity
		Activity []struct{ Caller, Transport, State, Target string }
	}
	if err := json.Unmarshal([]byte(res.Contents[0].Text), &page); err != nil {
		t.Fatal(err)
	}
	entries := page.Activity
	if len(entries) != 1 || entries[0].Caller != "resource-test" || entries[0].Transport != "stdio" ||
		entries[0].State != "confirmed" || entries[0].Target != "/v1/participants/p-000007" {
		t.Errorf("activity = %+v, want the one confirmed call by resource-test over stdio", entries)
	}
	// resources/list names it, so a client can show it without knowing
	// the template.
	list, err := sess.ListResources(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var uris []string
	for _, r := range list.Resources {
		uris = append(uris, r.URI)
	}
	if !slices.Contains(uris, "quota://activity/demo") {
		t.Errorf("resources/list = %v, want quota://activity/demo", uris)
	}
}

// TestStatusCommand prints the table and the JSON of the state file.
func TestStatusCommand(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	sess := s.stdioSession(t, nil)
	for i := range 3 {
		call(t, sess, "fetch", map[string]any{"path": fmt.Sprintf("/v1/participants/p-%06d", i+1)})
	}
	var out, errOut strings.Builder
	if err := run(t.Context(), []string{"status", "--config", s.config, "--state", s.state}, nil, &out, &errOut, s.getenv); err != nil {
		t.Fatalf("status: %v\n%s", err, errOut.String())
	}
	for _, want := range []string{"KEY", "POLICY", "REMAINING", "demo  default  local     120    117", "draft-11", "demo: continue: You can make 117 more calls"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := run(t.Context(), []string{"status", "--json", "--config", s.config, "--state", s.state}, nil, &out, &errOut, s.getenv); err != nil {
		t.Fatal(err)
	}
	var st struct {
		Keys []struct {
			Local []struct{ Used, Remaining int }
		}
	}
	if err := json.Unmarshal([]byte(out.String()), &st); err != nil || len(st.Keys) != 1 || st.Keys[0].Local[0].Used != 3 {
		t.Errorf("status --json = %s (%v); want 3 used", out.String(), err)
	}
}

// TestLegacyHandshakeOverHTTP drives the legacy initialize handshake by
// hand: a session ID is issued, and tool calls within the session work,
// next to the stateless 2026-07-28 protocol the go-sdk client uses.
func TestLegacyHandshakeOverHTTP(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	base, _ := s.serve(t)
	post := func(session, body string) (*http.Response, string) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+agentToken)
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	resp, body := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"legacy","version":"1"}}}`)
	session := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || session == "" || !strings.Contains(body, `"protocolVersion":"2025-06-18"`) {
		t.Fatalf("initialize: %d, session %q, %s", resp.StatusCode, session, body)
	}
	if resp, _ := post(session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode >= 300 {
		t.Fatalf("initialized: %d", resp.StatusCode)
	}
	resp, body = post(session, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fetch","arguments":{"path":"/v1/participants/p-000001"}}}`)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `p-000001`) || !strings.Contains(body, `"remaining":119`) {
		t.Errorf("tools/call in the session: %d %s", resp.StatusCode, body)
	}
}

// TestNonLoopbackNeedsCallers: serve refuses to listen beyond loopback
// when no caller tokens are configured, and says what to do.
func TestNonLoopbackNeedsCallers(t *testing.T) {
	dir := t.TempDir()
	config := dir + "/config.toml"
	if err := os.WriteFile(config, []byte(openKeyConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut strings.Builder
	err := run(t.Context(), []string{"serve", "--listen", "0.0.0.0:0", "--config", config, "--state", dir + "/state.db"},
		nil, &out, &errOut, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "without caller tokens") || !strings.Contains(err.Error(), "[[callers]]") {
		t.Errorf("serve on 0.0.0.0 without callers: %v; want a refusal naming [[callers]]", err)
	}
}
