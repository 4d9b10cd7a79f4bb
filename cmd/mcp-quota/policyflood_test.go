package main

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// TestStatusFitsWhateverTheUpstreamAnnounces: an upstream that announces
// 64 new policies, with names and partitions as long as its 8 KiB
// RateLimit-Policy field allows, on every answer, to each of 20 keys: quota_status of all of them, and of one, stays within
// maxResult characters, and shows at most 16 upstream policies per key
// with the count of the others.
func TestStatusFitsWhateverTheUpstreamAnnounces(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	long := "policy-name-that-goes-on-and-on-"
	flood := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		var items []string
		for j := range 64 {
			pk := base64.StdEncoding.EncodeToString([]byte(fmt.Sprintf("partition-%04d-%02d-of-the-key", i, j)))
			items = append(items, fmt.Sprintf(`"%s%d-%d";q=1000;w=3600;pk=:%s:`, long, i, j, pk))
		}
		w.Header().Set("RateLimit-Policy", strings.Join(items, ", "))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"ok":true}`)
	}))
	t.Cleanup(flood.Close)
	var floods []testkit.Key
	for i := range 20 {
		floods = append(floods, testkit.Key{Name: fmt.Sprintf("flood-%02d", i), BaseURL: flood.URL, SecretEnv: "DEMO_SECRET", Profile: "ietf"})
	}
	s := newSetup(t, demoKey(flood.URL, 120, time.Minute), floods...)
	sess := s.stdioSession(t, nil)
	for i := range 20 {
		for j := range 2 {
			if res, _ := call(t, sess, "fetch", map[string]any{"key": fmt.Sprintf("flood-%02d", i), "path": fmt.Sprintf("/x/%d", j)}); res.IsError {
				t.Fatalf("fetch: %s", text(res))
			}
		}
	}
	res, out := call(t, sess, "quota_status", map[string]any{"limit": 50})
	n50 := resultChars(t, res)
	t.Logf("quota_status of 21 keys after %d policies announced: %d characters", 64*n.Load(), n50)
	if n50 > maxResult {
		t.Errorf("quota_status of every key: %d characters, want at most %d", n50, maxResult)
	}
	if more, _ := out["more"].(map[string]any); more == nil && len(out["keys"].([]any)) < 21 {
		t.Errorf("quota_status shows %d keys and says nothing of the others", len(out["keys"].([]any)))
	}
	res, out = call(t, sess, "quota_status", map[string]any{"key": "flood-00"})
	t.Logf("quota_status of one flooded key: %d characters", resultChars(t, res))
	if c := resultChars(t, res); c > maxResult {
		t.Errorf("quota_status of one key: %d characters, want at most %d", c, maxResult)
	}
	k := out["keys"].([]any)[0].(map[string]any)
	if up := k["upstream"].([]any); len(up) > 16 || k["upstream_not_shown"] == nil {
		t.Errorf("one key shows %d upstream policies, %v not shown; want at most 16 and the count of the others", len(up), k["upstream_not_shown"])
	}
}
