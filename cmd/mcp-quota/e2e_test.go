package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
)

// checkTools checks what tools/list says: both tools, with input and
// output schemas and every annotation set.
func checkTools(t *testing.T, sess *gomcp.ClientSession) {
	t.Helper()
	list, err := sess.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range list.Tools {
		names = append(names, tool.Name)
		if tool.InputSchema == nil || tool.OutputSchema == nil {
			t.Errorf("tool %s: input schema %v, output schema %v; want both", tool.Name, tool.InputSchema != nil, tool.OutputSchema != nil)
		}
		a := tool.Annotations
		if a == nil || a.DestructiveHint == nil || a.OpenWorldHint == nil {
			t.Fatalf("tool %s: annotations %+v; want every hint set", tool.Name, a)
		}
		switch tool.Name {
		case "fetch":
			if !*a.OpenWorldHint || *a.DestructiveHint || !a.ReadOnlyHint {
				t.Errorf("fetch annotations %+v: want open-world, read-only, not destructive (the key allows GET/HEAD)", a)
			}
		case "quota_status":
			if *a.OpenWorldHint || *a.DestructiveHint || !a.ReadOnlyHint || !a.IdempotentHint {
				t.Errorf("quota_status annotations %+v: want read-only, idempotent, closed-world", a)
			}
		}
	}
	slices.Sort(names)
	if want := []string{"fetch", "quota_status"}; !slices.Equal(names, want) {
		t.Errorf("tools = %v, want %v", names, want)
	}
}

// checkFetchAndStatus fetches a page and checks the body, the quota and
// that quota_status agrees.
func checkFetchAndStatus(t *testing.T, sess *gomcp.ClientSession, api *demo.API) {
	t.Helper()
	res, out := call(t, sess, "fetch", map[string]any{"path": "/v1/participants", "query": map[string]any{"limit": "5"}})
	if res.IsError {
		t.Fatalf("fetch is an error: %s", text(res))
	}
	if out["status"] != float64(200) {
		t.Fatalf("status = %v, want 200", out["status"])
	}
	var page struct {
		Items []struct{ ID string } `json:"items"`
	}
	if err := json.Unmarshal([]byte(out["body"].(string)), &page); err != nil || len(page.Items) != 5 {
		t.Fatalf("body %q: %v items, err %v; want 5 participants", out["body"], len(page.Items), err)
	}
	q := out["quota"].(map[string]any)
	if q["key"] != "demo" || q["policy"] != "default" || q["limit"] != float64(120) || q["remaining"] != float64(119) {
		t.Errorf("quota = %v, want demo/default 119 of 120", q)
	}
	if a := out["advice"].(map[string]any); a["action"] != "continue" {
		t.Errorf("advice = %v, want continue", a)
	}
	if next, _ := out["next"].(map[string]any); next == nil || !strings.Contains(next["path"].(string), "cursor=") {
		t.Errorf("next = %v, want the next page's path", out["next"])
	}
	if got := len(api.Stats(upstreamSecret).Accepted); got != 1 {
		t.Errorf("upstream accepted %d calls, want 1", got)
	}

	res, st := call(t, sess, "quota_status", map[string]any{})
	if res.IsError {
		t.Fatalf("quota_status is an error: %s", text(res))
	}
	keys := st["keys"].([]any)
	k := keys[0].(map[string]any)
	up := k["upstream"].([]any)[0].(map[string]any)
	local := k["local"].([]any)[0].(map[string]any)
	if up["policy"] != "default" || up["q"] != float64(120) || up["w"] != float64(60) || up["r"] != float64(119) {
		t.Errorf("upstream policy = %v, want default q=120 w=60 r=119", up)
	}
	if local["used"] != float64(1) || local["remaining"] != float64(119) {
		t.Errorf("local budget = %v, want 1 used, 119 remaining", local)
	}
	if got := len(api.Stats(upstreamSecret).Accepted); got != 1 {
		t.Errorf("quota_status reached the upstream: %d calls, want 1", got)
	}
}

func TestStdioEndToEnd(t *testing.T) {
	api, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	sess := s.stdioSession(t, nil)
	checkTools(t, sess)
	checkFetchAndStatus(t, sess, api)
}

func TestHTTPEndToEnd(t *testing.T) {
	api, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	base, logs := s.serve(t)
	sess := httpSession(t, base, agentToken, nil)
	checkTools(t, sess)
	checkFetchAndStatus(t, sess, api)

	// GET /v1/quota is what quota_status returns.
	resp := get(t, base+"/v1/quota?key=demo", syncToken)
	defer resp.Body.Close()
	var st struct {
		Keys []struct {
			Key   string
			Quota struct{ Remaining int }
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/quota: %d, %v", resp.StatusCode, err)
	}
	if len(st.Keys) != 1 || st.Keys[0].Key != "demo" || st.Keys[0].Quota.Remaining != 119 {
		t.Errorf("GET /v1/quota = %+v, want demo with 119 remaining", st)
	}
	if strings.Contains(logs.String(), upstreamSecret) {
		t.Error("the server's log contains the upstream secret")
	}
}

// TestStdoutIsProtocolOnly sends raw JSON-RPC to `mcp-quota stdio` and
// checks that every line it writes to stdout is a JSON-RPC message, even
// with debug logging on and a call that fails.
func TestStdoutIsProtocolOnly(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	cmd, stderr := s.command(t, "stdio", "--log-level", "debug")
	requests := []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fetch","arguments":{"path":"/v1/participants?limit=1"}}}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"fetch","arguments":{"path":"/../etc/passwd"}}}`,
		`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"fetch","arguments":{"key":"nope","path":"/"}}}`,
		`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"quota_status","arguments":{}}}`,
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	io.WriteString(in, strings.Join(requests, "\n")+"\n")
	ids := map[float64]bool{}
	var all strings.Builder
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 1<<20)
	for len(ids) < 5 && sc.Scan() {
		line := sc.Text()
		all.WriteString(line + "\n")
		var msg struct {
			JSONRPC string  `json:"jsonrpc"`
			ID      float64 `json:"id"`
		}
		if err := json.Unmarshal([]byte(line), &msg); err != nil || msg.JSONRPC != "2.0" {
			t.Errorf("stdout line is not JSON-RPC: %q", line)
		}
		ids[msg.ID] = true
	}
	in.Close()
	io.Copy(&all, out)
	cmd.Wait()
	for _, id := range []float64{1, 2, 3, 4, 5} {
		if !ids[id] {
			t.Errorf("no answer to request %v on stdout:\n%s\nstderr:\n%s", id, all.String(), stderr.String())
		}
	}
	b := all.String()
	if !strings.Contains(stderr.String(), "level=DEBUG") {
		t.Errorf("debug logs did not go to stderr:\n%s", stderr.String())
	}
	for _, leak := range []string{upstreamSecret} {
		if strings.Contains(b+stderr.String(), leak) {
			t.Errorf("output contains a secret")
		}
	}
}
