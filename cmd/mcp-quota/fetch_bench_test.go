package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
)

// BenchmarkFetch measures, in one run on loopback, what the MCP fetch
// tool adds to a GET: `serve` runs in this process (Streamable HTTP, a
// real SQLite state file, a documented policy of 10⁹ calls a minute, so
// every admission counts a sliding window that never binds), and 4
// clients of the official Go SDK each call fetch one call after another,
// each on a target of its own (nothing kept to reuse). Beside it, in
// turns of the same run, 4 goroutines GET the same demo upstream
// directly with the credential, and 4 clients of the same SDK call a
// bare mcp-go Streamable HTTP server (in this process too) whose one tool
// makes that direct GET and answers with the body: what mcp-go and the
// client cost without mcp-quota. A fourth target, bare-fetch, is the same
// bare server with fetch as serve lists it (description and schemas,
// arguments validated) answering as fetch answers (its structured result
// and text, with the GET's body): what mcp-go and the client cost at
// fetch's size, so that mcp-fetch less bare-fetch is mcp-quota's own work
// (the key, the budget, the state, the walls, the sessions). Reported per target: p50 and p99 of one
// call, calls/s of the four together, and the CPU time of this process
// (server, clients and upstream together) per call; the log lines give
// the added p50 and the added CPU a call, which moves much less than
// latency with the load of a shared machine.
//
//	go test ./cmd/mcp-quota -run '^$' -bench BenchmarkFetch -benchtime 4000x -v
func BenchmarkFetch(b *testing.B) {
	_, upURL := upstreamAPI(b, demo.Config{Quota: 1 << 30, Window: time.Hour})
	key := demoKey(upURL, 1000000000, time.Minute)
	key.MaxRate, key.MaxConcurrency = 1000000000, 100000
	s := newSetup(b, key)
	base, _ := s.serve(b, "--log-level", "warn")
	const clients = 4
	sessions := make([]*gomcp.ClientSession, clients)
	for i := range sessions {
		sessions[i] = httpSession(b, base, agentToken, nil)
	}
	direct := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	get := func(path string) ([]byte, error) {
		req, _ := http.NewRequest(http.MethodGet, upURL+path, nil)
		req.Header.Set("Authorization", "Bearer "+upstreamSecret)
		resp, err := direct.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("direct GET: %d", resp.StatusCode)
		}
		return body, err
	}
	bareBase := bareHTTP(b, get)
	bareSessions := make([]*gomcp.ClientSession, clients)
	for i := range bareSessions {
		bareSessions[i] = httpSession(b, bareBase, "", nil)
	}
	shapedBase := bareFetchHTTP(b, get, fetchAsListed(b, httpSession(b, base, agentToken, nil)))
	shapedSessions := make([]*gomcp.ClientSession, clients)
	for i := range shapedSessions {
		shapedSessions[i] = httpSession(b, shapedBase, "", nil)
	}
	var n atomic.Int64 // every call a target of its own
	// callTool calls tool on the client's session of sessions, with a
	// path of its own; target names them in an error.
	callTool := func(target string, sessions []*gomcp.ClientSession, tool string) func(b *testing.B, client int) error {
		return func(b *testing.B, client int) error {
			res, err := sessions[client].CallTool(b.Context(), &gomcp.CallToolParams{Name: tool,
				Arguments: map[string]any{"path": fmt.Sprintf("/v1/echo?n=%d", n.Add(1))}})
			if err != nil {
				return err
			}
			if res.IsError {
				return fmt.Errorf("%s, %s: %s", target, tool, text(res))
			}
			return nil
		}
	}
	calls := map[string]func(b *testing.B, client int) error{
		"direct-get": func(b *testing.B, _ int) error {
			_, err := get(fmt.Sprintf("/v1/echo?n=%d", n.Add(1)))
			return err
		},
		"bare-mcp":   callTool("bare-mcp", bareSessions, "get"),
		"bare-fetch": callTool("bare-fetch", shapedSessions, "fetch"),
		"mcp-fetch":  callTool("mcp-fetch", sessions, "fetch"),
	}
	names := []string{"direct-get", "bare-mcp", "bare-fetch", "mcp-fetch"}
	run := func(b *testing.B, name string, total int, d *[]time.Duration) time.Duration {
		var mu sync.Mutex
		var left atomic.Int64
		left.Store(int64(total))
		var wg sync.WaitGroup
		start := time.Now()
		for c := range clients {
			wg.Go(func() {
				var mine []time.Duration
				for left.Add(-1) >= 0 {
					t0 := time.Now()
					if err := calls[name](b, c); err != nil {
						b.Error(err)
						return
					}
					mine = append(mine, time.Since(t0))
				}
				mu.Lock()
				*d = append(*d, mine...)
				mu.Unlock()
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	for _, name := range names { // warm: connections open, statements planned
		var d []time.Duration
		run(b, name, 200, &d)
	}
	// The targets take turns in rounds: on a machine whose speed drifts
	// (a shared VM), each meets the same drift.
	const rounds = 5
	d := map[string]*[]time.Duration{}
	took, cpu := map[string]time.Duration{}, map[string]time.Duration{}
	for _, name := range names {
		d[name] = new([]time.Duration)
	}
	b.ResetTimer()
	for range rounds {
		for _, name := range names {
			c0 := processCPU()
			took[name] += run(b, name, max(b.N/rounds, clients), d[name])
			cpu[name] += processCPU() - c0
		}
	}
	b.StopTimer()
	p50 := map[string]time.Duration{}
	for _, name := range names {
		ds := *d[name]
		slices.Sort(ds)
		p50[name] = ds[len(ds)/2]
		b.ReportMetric(float64(p50[name].Microseconds()), "p50-µs-"+name)
		b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds()), "p99-µs-"+name)
		b.ReportMetric(float64(len(ds))/took[name].Seconds(), "calls/s-"+name)
		b.ReportMetric(float64(cpu[name].Microseconds())/float64(len(ds)), "cpu-µs/call-"+name)
	}
	perCall := func(name string) time.Duration { return cpu[name] / time.Duration(len(*d[name])) }
	for _, name := range []string{"mcp-fetch", "bare-fetch", "bare-mcp"} {
		b.Logf("%s: added p50 %v over a direct GET (%v against %v), %d clients; CPU a call %v against %v (added %v)", name,
			(p50[name] - p50["direct-get"]).Round(time.Microsecond), p50[name], p50["direct-get"], clients,
			perCall(name).Round(time.Microsecond), perCall("direct-get").Round(time.Microsecond),
			(perCall(name) - perCall("direct-get")).Round(time.Microsecond))
	}
	b.Logf("mcp-quota's own work: mcp-fetch over bare-fetch, p50 +%v, CPU a call +%v",
		(p50["mcp-fetch"] - p50["bare-fetch"]).Round(time.Microsecond), (perCall("mcp-fetch") - perCall("bare-fetch")).Round(time.Microsecond))
}

// bareHTTP serves, on loopback, a bare mcp-go Streamable HTTP server
// with one tool, get, that answers with the body get(path) returns, and
// returns its base URL (the MCP endpoint is base/mcp).
func bareHTTP(b *testing.B, get func(path string) ([]byte, error)) string {
	s := server.NewMCPServer("bare", "1", server.WithToolCapabilities(false))
	s.AddTool(mcp.NewTool("get", mcp.WithDescription("GET a path of the upstream."), mcp.WithString("path", mcp.Required())),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			body, err := get(req.GetString("path", ""))
			if err != nil {
				return mcp.NewToolResultError(err.Error()), nil
			}
			return mcp.NewToolResultText(string(body)), nil
		})
	mux := http.NewServeMux()
	mux.Handle("/mcp", server.NewStreamableHTTPServer(s))
	ts := httptest.NewServer(mux)
	b.Cleanup(ts.Close)
	return ts.URL
}

// A listedFetch is the fetch tool as a client of serve sees it: its
// description and schemas from tools/list, and the result of one fetch.
type listedFetch struct {
	description    string
	input, output  json.RawMessage
	structured     map[string]any // the result's structuredContent
	textBeforeBody string         // its text up to the body
}

// fetchAsListed lists sess's tools and calls fetch once.
func fetchAsListed(b *testing.B, sess *gomcp.ClientSession) listedFetch {
	tools, err := sess.ListTools(b.Context(), nil)
	if err != nil {
		b.Fatal(err)
	}
	var f listedFetch
	for _, t := range tools.Tools {
		if t.Name != "fetch" {
			continue
		}
		f.description = t.Description
		if f.input, err = json.Marshal(t.InputSchema); err == nil {
			f.output, err = json.Marshal(t.OutputSchema)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	if f.input == nil || string(f.output) == "null" {
		b.Fatalf("serve lists no fetch tool with both schemas: %+v", tools.Tools)
	}
	res, err := sess.CallTool(b.Context(), &gomcp.CallToolParams{Name: "fetch", Arguments: map[string]any{"path": "/v1/echo?n=0"}})
	if err != nil {
		b.Fatalf("fetch: %v", err)
	}
	if res.IsError {
		b.Fatalf("fetch: %s", text(res))
	}
	f.structured, _ = res.StructuredContent.(map[string]any)
	body, _ := f.structured["body"].(string)
	before, found := strings.CutSuffix(text(res), body)
	if body == "" || !found {
		b.Fatalf("fetch's result has no body, or its text does not end with it: %+v", res)
	}
	f.textBeforeBody = before
	return f
}

// bareFetchHTTP serves, on loopback, a bare mcp-go Streamable HTTP server
// whose one tool is fetch as f lists it (its description and schemas,
// arguments validated against the input schema as serve validates them)
// and answers as fetch did in f, with the body and path of the direct
// GET it makes: what mcp-go and the client cost at fetch's size, without
// mcp-quota's own work (the key, the budget, the state, the walls).
func bareFetchHTTP(b *testing.B, get func(path string) ([]byte, error), f listedFetch) string {
	s := server.NewMCPServer("bare", "1", server.WithToolCapabilities(false), server.WithInputSchemaValidation())
	tool := mcp.NewToolWithRawSchema("fetch", f.description, f.input)
	tool.RawOutputSchema = f.output
	s.AddTool(tool, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		path := req.GetString("path", "")
		body, err := get(path)
		if err != nil {
			return mcp.NewToolResultError(err.Error()), nil
		}
		sc := maps.Clone(f.structured)
		sc["path"], sc["body"], sc["total_length"] = path, string(body), len(body)
		raw, err := json.Marshal(sc)
		if err != nil {
			return nil, err
		}
		return mcp.NewToolResultStructured(json.RawMessage(raw), f.textBeforeBody+string(body)), nil
	})
	mux := http.NewServeMux()
	mux.Handle("/mcp", server.NewStreamableHTTPServer(s))
	ts := httptest.NewServer(mux)
	b.Cleanup(ts.Close)
	return ts.URL
}

// processCPU returns the CPU time this process has taken, user and system.
func processCPU() time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
