package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// maxResult is the README's bound on a whole fetch result: the text block
// and structuredContent together, as JSON, in characters.
const maxResult = 60000

func resultChars(t *testing.T, res *gomcp.CallToolResult) int {
	t.Helper()
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	return utf8.RuneCount(b)
}

// TestResultsFitInContext: whatever max_length asks and whatever the body
// holds (JSON escapes a quote to two characters and < > & to six), a whole
// fetch result stays within maxResult characters, and reading on from
// next_start_index continues exactly where the cut page stopped.
func TestResultsFitInContext(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{})
	markup := strings.Repeat(`<a href="x">&amp;</a>"quoted" `, 20000)
	html := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, markup)
	}))
	t.Cleanup(html.Close)
	s := newSetup(t, demoKey(url, 120, time.Minute), testkit.Key{Name: "html", BaseURL: html.URL, SecretEnv: "DEMO_SECRET"})
	sess := s.stdioSession(t, nil)
	report := fetchDirect(t, url+"/v1/report?bytes=1000000")
	tests := []struct {
		name      string
		args      map[string]any
		body      string
		wantWarn  string
		wantBelow int // the page is shorter than this many characters
	}{
		{"JSON at the defaults", map[string]any{"key": "demo", "path": "/v1/report?bytes=1000000"}, report, "", 8001},
		{"JSON at the largest max_length", map[string]any{"key": "demo", "path": "/v1/report?bytes=1000000", "max_length": 25000}, report, "", 25001},
		{"JSON at max_length beyond the largest", map[string]any{"key": "demo", "path": "/v1/report?bytes=1000000", "max_length": 100000}, report, "max_length is at most 25000", 25001},
		{"max_wait_s beyond the largest", map[string]any{"key": "demo", "path": "/v1/report?bytes=1000000", "max_wait_s": 600}, report, "max_wait_s is at most 60 seconds", 8001},
		{"markup at the largest max_length", map[string]any{"key": "html", "path": "/", "max_length": 25000}, markup, "so the whole result stays under 60000", 25000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, out := call(t, sess, "fetch", tt.args)
			if res.IsError {
				t.Fatalf("fetch: %s", text(res))
			}
			n := resultChars(t, res)
			t.Logf("%s: whole result %d characters (text block %d)", tt.name, n, utf8.RuneCountInString(text(res)))
			if n > maxResult {
				t.Errorf("the result has %d characters, more than %d", n, maxResult)
			}
			next := int(out["next_start_index"].(float64))
			if out["truncated"] != true || next <= 0 || next >= tt.wantBelow {
				t.Errorf("truncated=%v next_start_index=%d; want a cut page shorter than %d", out["truncated"], next, tt.wantBelow)
			}
			if tt.wantWarn != "" && !strings.Contains(strings.Join(warnings(out), " "), tt.wantWarn) {
				t.Errorf("warnings %v do not say %q", out["warnings"], tt.wantWarn)
			}
			page := pageBody(out)
			if page != prefixChars(tt.body, next) {
				t.Fatalf("the page is not the body's first %d characters", next)
			}
			args := map[string]any{"start_index": next}
			for k, v := range tt.args {
				if k != "start_index" {
					args[k] = v
				}
			}
			_, out2 := call(t, sess, "fetch", args)
			next2 := int(out2["next_start_index"].(float64))
			if got, want := page+pageBody(out2), prefixChars(tt.body, next2); got != want {
				t.Errorf("reading on from %d does not continue the body where the page stopped", next)
			}
		})
	}
}

func warnings(out map[string]any) []string {
	var ws []string
	list, _ := out["warnings"].([]any)
	for _, w := range list {
		ws = append(ws, w.(string))
	}
	return ws
}

// pageBody is the body a result shows without the marker that says where
// to read on.
func pageBody(out map[string]any) string {
	b := out["body"].(string)
	if i := strings.LastIndex(b, "\n[truncated"); i >= 0 {
		return b[:i]
	}
	return b
}

func prefixChars(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}

// fetchDirect reads url from the demo upstream with its secret.
func fetchDirect(t *testing.T, url string) string {
	t.Helper()
	resp := get(t, url, upstreamSecret)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestStatusStaysSmall: with 1,000 keys, quota_status without a key shows
// the most constrained in detail and summarises the rest, offset pages
// through them, and the fetch tool's description stays short.
func TestStatusStaysSmall(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{})
	var others []testkit.Key
	for i := range 999 {
		others = append(others, testkit.Key{Name: fmt.Sprintf("key-%04d", i), BaseURL: url, SecretEnv: "DEMO_SECRET",
			Policies: testkit.Window(100, time.Minute)})
	}
	s := newSetup(t, demoKey(url, 120, time.Minute), others...)
	sess := s.stdioSession(t, nil)
	// Spend on one key so that it is the most constrained.
	for i := range 3 {
		call(t, sess, "fetch", map[string]any{"key": "key-0500", "path": fmt.Sprintf("/v1/participants/p-%06d", i+1)})
	}

	tools, err := sess.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		if n := len(tool.Description); n > 600 {
			t.Errorf("the %s description has %d characters with 1,000 keys", tool.Name, n)
		}
	}

	res, out := call(t, sess, "quota_status", map[string]any{})
	n := resultChars(t, res)
	t.Logf("quota_status of 1,000 keys: %d characters", n)
	if n > 20000 {
		t.Errorf("quota_status of 1,000 keys has %d characters", n)
	}
	keys := out["keys"].([]any)
	more, _ := out["more"].(map[string]any)
	if len(keys) != 10 || more == nil || more["keys"] != float64(990) || more["next_offset"] != float64(10) {
		t.Fatalf("shows %d keys and more=%v; want 10 in detail and 990 summarised", len(keys), more)
	}
	if first := keys[0].(map[string]any)["key"]; first != "key-0500" {
		t.Errorf("the first key shown is %v, want key-0500, the one with the least left", first)
	}
	_, out = call(t, sess, "quota_status", map[string]any{"offset": 995, "limit": 50})
	if keys := out["keys"].([]any); len(keys) != 5 || out["more"].(map[string]any)["next_offset"] != nil {
		t.Errorf("offset=995 shows %d keys, more=%v; want the last 5 and no next page", len(keys), out["more"])
	}
	res, out = call(t, sess, "quota_status", map[string]any{"key": "key-0001"})
	t.Logf("quota_status of 1 key: %d characters", resultChars(t, res))
	if keys := out["keys"].([]any); len(keys) != 1 || out["more"] != nil {
		t.Errorf("key=key-0001 shows %d keys and more=%v", len(keys), out["more"])
	}
	if res, _ := call(t, sess, "quota_status", map[string]any{"limit": 500}); !res.IsError || errorCode(res) != "badArguments" {
		t.Errorf("limit=500: %s, want badArguments", text(res))
	}
}
