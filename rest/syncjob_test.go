package rest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// TestSyncJobBesideAnAgent is the README's sync-job example: a standard
// retrying client (go-retryablehttp with its default policy) pages
// through 10,000 participants, 500 a page, following the next links
// through the REST side, while an agent spends the same key over MCP.
// The key allows 20 calls a second, so the two together must be paced:
// the sync job and the upstream see no 429 at all.
func TestSyncJobBesideAnAgent(t *testing.T) {
	s := newStack(t, stackConfig{
		Demo: demo.Config{Quota: 20, Window: time.Second},
		Keys: defaultKeysWith(20, time.Second),
	})
	ctx := context.Background()

	var agentCalls, agentPaused int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		mc, err := client.NewStreamableHttpClient(s.URL+"/mcp", transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + agentToken}))
		if err != nil {
			t.Error(err)
			return
		}
		defer mc.Close()
		init := mcp.InitializeRequest{}
		init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
		init.Params.ClientInfo = mcp.Implementation{Name: "agent", Version: "1"}
		if err := mc.Start(ctx); err != nil {
			t.Error(err)
			return
		}
		if _, err := mc.Initialize(ctx, init); err != nil {
			t.Error(err)
			return
		}
		for i := range 10 {
			req := mcp.CallToolRequest{}
			req.Params.Name = "fetch"
			req.Params.Arguments = map[string]any{"key": "demo", "path": fmt.Sprintf("/v1/participants/p-%06d", i+1), "max_wait_s": 10}
			res, err := mc.CallTool(ctx, req)
			if err != nil {
				t.Errorf("agent call %d: %v", i+1, err)
				return
			}
			agentCalls++
			if res.IsError {
				agentPaused++
			}
		}
	}()

	rc := retryablehttp.NewClient() // the default policy: retries 429 and 5xx, honours Retry-After
	rc.Logger = nil
	var mu sync.Mutex
	statuses := map[int]int{}
	rc.ResponseLogHook = func(_ retryablehttp.Logger, resp *http.Response) {
		mu.Lock()
		statuses[resp.StatusCode]++
		mu.Unlock()
	}
	start := time.Now()
	records, pages := 0, 0
	next := s.URL + "/k/demo/v1/participants?limit=500"
	for next != "" {
		req, err := retryablehttp.NewRequest("GET", next, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+syncToken)
		resp, err := rc.Do(req)
		if err != nil {
			t.Fatalf("page %d: %v", pages+1, err)
		}
		var page struct{ Items []json.RawMessage }
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("page %d: %d %v", pages+1, resp.StatusCode, err)
		}
		records += len(page.Items)
		pages++
		next = nextLink(resp)
	}
	elapsed := time.Since(start)
	wg.Wait()

	if records != 10000 || pages != 20 {
		t.Errorf("synced %d records in %d pages, want 10000 in 20", records, pages)
	}
	if statuses[http.StatusTooManyRequests] != 0 || len(statuses) != 1 {
		t.Errorf("the sync job saw statuses %v, want only 200s", statuses)
	}
	st := s.API.Stats(upstreamSecret)
	if st.Rejected != 0 {
		t.Errorf("the upstream refused %d calls", st.Rejected)
	}
	// The promise mcp-quota controls: it admits no more than 20 calls in
	// any second, over both callers. The upstream counts arrivals, which
	// follow admissions by a latency that a loaded machine stretches
	// unevenly; its own (fixed-window) count is the refusal check above.
	var admitted []time.Time
	if err := s.DB.View(ctx, func(tx ledger.ReadTx) error {
		list, err := tx.Activity(ledger.ActivityFilter{Key: "demo", Limit: 10_000})
		for _, a := range list {
			if a.State != ledger.RejectedLocal {
				admitted = append(admitted, a.At)
			}
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got := (demo.Stats{Accepted: admitted}).MaxInWindow(time.Second); got > 20 {
		t.Errorf("mcp-quota admitted %d calls in one second, more than the key's 20", got)
	}
	if agentCalls != 10 || agentPaused != 0 {
		t.Errorf("the agent made %d calls, %d paused; want 10, none paused", agentCalls, agentPaused)
	}
	t.Logf("20 pages and %d agent calls in %v; the upstream got %d requests, at most %d in any second",
		agentCalls, elapsed.Round(time.Millisecond), st.Requests, st.MaxInWindow(time.Second))
}

// nextLink returns the absolute URL of resp's Link rel="next", or "".
func nextLink(resp *http.Response) string {
	for _, v := range resp.Header.Values("Link") {
		for _, link := range strings.Split(v, ",") {
			target, params, ok := strings.Cut(link, ";")
			if !ok || !strings.Contains(params, `rel="next"`) {
				continue
			}
			ref, err := url.Parse(strings.Trim(strings.TrimSpace(target), "<>"))
			if err != nil {
				return ""
			}
			return resp.Request.URL.ResolveReference(ref).String()
		}
	}
	return ""
}
