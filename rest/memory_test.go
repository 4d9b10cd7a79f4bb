package rest_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/mcp-quota/mcp-quota/rest"
	"github.com/mcp-quota/mcp-quota/tools"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// TestWallsBodyMemoryBound: the bodies held in memory by the calls in
// flight, over all callers, stay within the configured bound. Sixteen
// concurrent fetches of a 3 MiB body under an 8 MiB bound each either
// get the whole body or a bodyMemory isError, and the most held at once
// stays under the bound; with the bound taken, a fetch is refused before
// anything is sent, a REST request whose body would be buffered gets a
// 503 bodyMemory problem with nothing sent, and a REST answer that would
// be read ahead streams instead.
func TestWallsBodyMemoryBound(t *testing.T) {
	t.Parallel()
	const bound, size = 8 << 20, 3 << 20
	big := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	var sent atomic.Int64
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		switch r.URL.Path {
		case "/small":
			w.Write([]byte("small"))
			return
		case "/mid":
			w.Write(big[:200<<10])
			return
		}
		w.Write(big)
	})
	var mem *upstream.BodyMemory
	cs := callersWith(map[string][]string{"sync": {"demo", "other"}, "agent": {"demo", "other"}})
	s := newStack(t, stackConfig{Upstream: up, Callers: cs, QuietLog: true,
		Client: func(c *upstream.Client) { mem = upstream.NewBodyMemory(bound); c.Bodies = mem },
		Fetch:  tools.FetchLimits{MaxBody: 4 << 20}})

	var wg sync.WaitGroup
	results := make([]string, 16)
	for i := range results {
		mc := mcpClient(t, s, agentToken)
		wg.Go(func() {
			res, sc := callTool(t, mc, "fetch", map[string]any{"key": "demo", "path": fmt.Sprintf("/big?i=%d", i), "max_length": 10,
				"max_wait_s": 60}) // the key lets 4 at once: the others wait their turn
			if !res.IsError {
				var f struct {
					Total int `json:"total_length"`
				}
				json.Unmarshal([]byte(sc), &f)
				sc = fmt.Sprintf("whole:%v", f.Total == size)
			}
			results[i] = sc
		})
	}
	wg.Wait()
	used, peak := mem.Used()
	whole := 0
	for i, r := range results {
		switch {
		case r == "whole:true":
			whole++
		case strings.Contains(r, `"code":"bodyMemory"`) && strings.Contains(r, "8 MiB"):
		default:
			t.Errorf("fetch %d: %s; want the whole body or a bodyMemory error naming the bound", i, r)
		}
	}
	t.Logf("%d of %d fetches got the whole body; the most held at once was %d KiB of %d", whole, len(results), peak>>10, bound>>10)
	if whole == 0 || peak > bound || peak < size || used != 0 {
		t.Errorf("%d whole, peak %d, still held %d; want at least one whole, a peak of at least %d and at most %d, nothing held after",
			whole, peak, used, size, bound)
	}

	// With the bound taken by others, nothing more fits.
	other := mem.Hold()
	if err := other.Grow(bound - 16<<10); err != nil {
		t.Fatal(err)
	}
	before := sent.Load()
	res, sc := callTool(t, mcpClient(t, s, agentToken), "fetch", map[string]any{"key": "demo", "path": "/small"})
	if !res.IsError || !strings.Contains(sc, `"code":"bodyMemory"`) || !strings.Contains(sc, "nothing was sent") {
		t.Errorf("fetch with the bound taken: %s; want bodyMemory, nothing sent", sc)
	}
	resp, b := s.do(t, "POST", "/k/demo/small", syncToken, strings.NewReader(strings.Repeat("x", 200<<10)))
	var p struct{ Code, Detail string }
	json.Unmarshal(b, &p)
	if resp.StatusCode != http.StatusServiceUnavailable || p.Code != rest.CodeBodyMemory || resp.Header.Get("Retry-After") == "" {
		t.Errorf("REST with the bound taken: %s %s; want 503 %s with Retry-After", resp.Status, b, rest.CodeBodyMemory)
	}
	if n := sent.Load() - before; n != 0 {
		t.Errorf("%d requests went upstream with the bound taken; want none", n)
	}
	other.Release()
	// A little room: a REST answer that would be read ahead streams.
	if err := other.Grow(bound - 128<<10); err != nil {
		t.Fatal(err)
	}
	resp, b = s.do(t, "GET", "/k/demo/mid", syncToken, nil)
	if resp.StatusCode != 200 || !bytes.Equal(b, big[:200<<10]) || resp.ContentLength != -1 {
		t.Errorf("REST with little room: %s, %d bytes, Content-Length %d; want the whole answer, streamed (no length)",
			resp.Status, len(b), resp.ContentLength)
	}
	other.Release()
	if used, _ := mem.Used(); used != 0 {
		t.Errorf("%d bytes still held after every call ended; want none", used)
	}
}
