package main

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	neturl "net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/state"
)

// otlpReceiver is an OTLP/HTTP trace receiver: it keeps every request's
// bytes as they came, and the spans they held.
type otlpReceiver struct {
	mu    sync.Mutex
	raw   [][]byte
	spans []*tracepb.Span
	names map[string]bool // service.name of the resources
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
		http.Error(w, "not here", http.StatusNotFound)
		return
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	o.raw = append(o.raw, b)
	for _, rs := range req.ResourceSpans {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				o.names[a.Value.GetStringValue()] = true
			}
		}
		for _, ss := range rs.ScopeSpans {
			o.spans = append(o.spans, ss.Spans...)
		}
	}
	o.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

func attrs(s *tracepb.Span) map[string]string {
	m := map[string]string{}
	for _, a := range s.Attributes {
		m[a.Key] = anyValue(a.Value)
	}
	return m
}

func anyValue(v *commonpb.AnyValue) string {
	switch x := v.Value.(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	}
	return v.String()
}

// Secrets of the tracing test, besides the callers' tokens.
const (
	bearerSecret = "bearer-secret-51c0e7d2a98f"
	querySecret  = "query-secret-9e27b4f01c6d"
)

// withHeader sets a header field on every request.
type withHeader struct {
	name, value string
	base        http.RoundTripper
}

func (h withHeader) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(h.name, h.value)
	return h.base.RoundTrip(r)
}

// TestTracesOverOTLP drives a real serve, with traces exported to an
// OTLP/HTTP receiver in the test, through the official MCP client and a
// REST call, and checks the spans, their parents, their attributes, the
// trace context taken from traceparent and from _meta, and that no
// exported byte holds a secret.
func TestTracesOverOTLP(t *testing.T) {
	rcv := &otlpReceiver{names: map[string]bool{}}
	collector := httptest.NewServer(rcv)
	defer collector.Close()

	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+bearerSecret && r.URL.Query().Get("api_key") != querySecret {
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		w.Header().Set("RateLimit-Policy", `"default";q=100;w=60`)
		w.Header().Set("RateLimit", `"default";r=42;t=30`)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"ok":true}`)
	}))
	defer api.Close()

	dir := t.TempDir()
	config := filepath.Join(dir, "config.toml")
	both := []string{"bear", "qk"}
	cfg := testkit.Config{
		Keys: []testkit.Key{
			{Name: "bear", BaseURL: api.URL, SecretEnv: "BEAR_SECRET", Auth: "bearer", Profile: "ietf", Policies: testkit.Window(1, time.Second)},
			{Name: "qk", BaseURL: api.URL, SecretEnv: "Q_SECRET", Auth: "query:api_key", Profile: "ietf"},
		},
		Callers: []testkit.Caller{{Name: "agent", TokenEnv: "AGENT_TOKEN", Keys: both}, {Name: "sync", TokenEnv: "SYNC_TOKEN", Keys: both}},
	}
	if err := os.WriteFile(config, []byte(cfg.TOML()), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"BEAR_SECRET": bearerSecret, "Q_SECRET": querySecret, "AGENT_TOKEN": agentToken, "SYNC_TOKEN": syncToken,
		"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL, "OTEL_SERVICE_NAME": "quota-under-test"}
	base, logs, stop := startServe(t, func(k string) string { return env[k] }, "--config", config, "--state", testkit.StateFile(t, state.Open))

	const (
		traceA = "0af7651916cd43dd8448eb211c80319c" // the MCP session's HTTP traceparent
		spanA  = "b7ad6b7169203331"
		traceB = "4bf92f3577b34da6a3ce929d0e0e4736" // one tools/call's _meta traceparent
		spanB  = "00f067aa0ba902b7"
		traceC = "5b8aa5a2d2c872e8321cf37308d69df2" // the REST call's traceparent
		spanC  = "051581bf3cb55c13"
		traceD = "9d3b5c7a1e2f40618293a4b5c6d7e8f9" // the raw 2025-06-18 session's
		spanD  = "1a2b3c4d5e6f7081"
	)
	hc := &http.Client{Transport: withHeader{"traceparent", "00-" + traceA + "-" + spanA + "-01",
		bearer{agentToken, http.DefaultTransport}}}
	client := gomcp.NewClient(&gomcp.Implementation{Name: "e2e", Version: "1"}, nil)
	sess, err := client.Connect(t.Context(), &gomcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connect over HTTP: %v", err)
	}
	res, err := sess.CallTool(t.Context(), &gomcp.CallToolParams{Name: "fetch", Arguments: map[string]any{"key": "bear", "path": "/items"}})
	if err != nil || res.IsError {
		t.Fatalf("fetch through bear: %v %s", err, text(res))
	}
	// The second call waits for the budget of one call a second.
	_, err = sess.CallTool(t.Context(), &gomcp.CallToolParams{Name: "fetch", Arguments: map[string]any{"key": "bear", "path": "/items"},
		Meta: gomcp.Meta{"traceparent": "00-" + traceB + "-" + spanB + "-01", "tracestate": "vendor=x"}})
	if err != nil {
		t.Fatalf("second fetch through bear: %v", err)
	}
	res, err = sess.CallTool(t.Context(), &gomcp.CallToolParams{Name: "fetch", Arguments: map[string]any{"key": "nokey", "path": "/items"}})
	if err != nil || !res.IsError {
		t.Fatalf("fetch through a key that does not exist: %v, isError %v", err, res != nil && res.IsError)
	}
	sess.Close()

	resp := get(t, base+"/k/qk/items?page=2", syncToken, "traceparent", "00-"+traceC+"-"+spanC+"-01")
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /k/qk/items: %d", resp.StatusCode)
	}
	// A client of a revision with sessions: its requests name the session.
	post := func(body, session string) *http.Response {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/mcp", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+agentToken)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("traceparent", "00-"+traceD+"-"+spanD+"-01")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
			req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	init := post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`, "")
	session := init.Header.Get("Mcp-Session-Id")
	if session == "" {
		t.Fatalf("initialize (2025-06-18): %d, no session", init.StatusCode)
	}
	post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`, session)
	if r := post(`{"jsonrpc":"2.0","id":"list-1","method":"tools/list"}`, session); r.StatusCode != http.StatusOK {
		t.Fatalf("tools/list in the session: %d", r.StatusCode)
	}

	post(`{"jsonrpc":"2.0","id":"bad-1","method":"tools/call","params":{"name":"nosuchtool","arguments":{}}}`, session)

	if err := stop(); err != nil { // sends the spans not yet sent
		t.Fatalf("serve: %v\n%s", err, logs.String())
	}

	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	if !rcv.names["quota-under-test"] {
		t.Errorf("service names %v, want quota-under-test from OTEL_SERVICE_NAME", rcv.names)
	}
	byID := map[string]*tracepb.Span{}
	for _, s := range rcv.spans {
		byID[hex.EncodeToString(s.SpanId)] = s
	}
	children := func(p *tracepb.Span) []*tracepb.Span {
		var out []*tracepb.Span
		for _, s := range rcv.spans {
			if bytes.Equal(s.ParentSpanId, p.SpanId) && bytes.Equal(s.TraceId, p.TraceId) {
				out = append(out, s)
			}
		}
		return out
	}
	find := func(name, trace string) []*tracepb.Span {
		var out []*tracepb.Span
		for _, s := range rcv.spans {
			if s.Name == name && (trace == "" || hex.EncodeToString(s.TraceId) == trace) {
				out = append(out, s)
			}
		}
		return out
	}
	var names []string
	for _, s := range rcv.spans {
		names = append(names, fmt.Sprintf("%s(%s)", s.Name, hex.EncodeToString(s.TraceId)[:6]))
	}

	// The session's requests carry its traceparent: its first request
	// (server/discover in the 2026-07-28 revision, initialize before) too.
	if len(find("server/discover", traceA))+len(find("initialize", traceA)) != 1 {
		t.Errorf("spans %v: want one server/discover or initialize in trace %s", names, traceA)
	}
	calls := find("tools/call fetch", traceA)
	if len(calls) != 2 {
		t.Fatalf("spans %v: want two 'tools/call fetch' in the header's trace (one ok, one a tool error)", names)
	}
	for _, c := range calls {
		a := attrs(c)
		if c.Kind != tracepb.Span_SPAN_KIND_SERVER || hex.EncodeToString(c.ParentSpanId) != spanA {
			t.Errorf("%s: kind %v parent %x, want a server span under %s", c.Name, c.Kind, c.ParentSpanId, spanA)
		}
		for k, want := range map[string]string{"mcp.method.name": "tools/call", "gen_ai.tool.name": "fetch",
			"gen_ai.operation.name": "execute_tool", "network.transport": "tcp"} {
			if a[k] != want {
				t.Errorf("%s: %s = %q, want %q", c.Name, k, a[k], want)
			}
		}
		for _, k := range []string{"mcp.protocol.version", "jsonrpc.request.id"} {
			if a[k] == "" {
				t.Errorf("%s: no %s in %v", c.Name, k, a)
			}
		}
		// A session (and its ID) exists in the revisions before 2026-07-28.
		if a["mcp.protocol.version"] < "2026-07-28" && a["mcp.session.id"] == "" {
			t.Errorf("%s: no mcp.session.id in %v", c.Name, a)
		}
		if a["gen_ai.tool.name"] != "fetch" {
			continue
		}
		if a["error.type"] == "tool_error" {
			if c.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR {
				t.Errorf("the tool error's span: status %v, want error", c.Status)
			}
			continue
		}
		// The call that went out: its attempt, a client span, with what
		// the answer's fields said.
		var attempt *tracepb.Span
		for _, ch := range children(c) {
			if ch.Kind == tracepb.Span_SPAN_KIND_CLIENT {
				attempt = ch
			}
		}
		if attempt == nil {
			t.Errorf("the fetch span has no client span for its attempt: children %v", children(c))
			continue
		}
		got := attrs(attempt)
		for k, want := range map[string]string{"http.request.method": "GET", "http.response.status_code": "200",
			"mcp_quota.key": "bear", "mcp_quota.ratelimit.policy": "default", "mcp_quota.ratelimit.remaining": "42",
			"mcp_quota.ratelimit.reset": "30", "mcp_quota.ratelimit.quota": "100"} {
			if got[k] != want {
				t.Errorf("attempt span: %s = %q, want %q (all: %v)", k, got[k], want, got)
			}
		}
		if a["mcp_quota.call.id"] == "" || a["mcp_quota.call.state"] == "" {
			t.Errorf("the fetch span does not name its call: %v", a)
		}
	}
	var toolErrors int
	for _, c := range calls {
		if attrs(c)["error.type"] == "tool_error" {
			toolErrors++
		}
	}
	if toolErrors != 1 {
		t.Errorf("%d tool_error spans, want 1", toolErrors)
	}

	// _meta's traceparent wins over the header's.
	metaCalls := find("tools/call fetch", traceB)
	if len(metaCalls) != 1 || hex.EncodeToString(metaCalls[0].ParentSpanId) != spanB {
		t.Fatalf("spans %v: want one 'tools/call fetch' under %s from _meta", names, spanB)
	}
	if ts := metaCalls[0].TraceState; ts != "vendor=x" {
		t.Errorf("the _meta call's tracestate = %q, want vendor=x", ts)
	}
	var wait *tracepb.Span
	for _, ch := range children(metaCalls[0]) {
		if ch.Name == "wait for budget" {
			wait = ch
		}
	}
	if wait == nil {
		t.Fatalf("the second fetch (one call a second) has no 'wait for budget' span: children %v", children(metaCalls[0]))
	}
	if a := attrs(wait); a["mcp_quota.wait.held_by"] != "default" || a["mcp_quota.key"] != "bear" || a["mcp_quota.wait.seconds"] == "" {
		t.Errorf("wait span attributes %v, want held by policy default on key bear, with its length", a)
	}
	if wait.EndTimeUnixNano <= wait.StartTimeUnixNano {
		t.Errorf("wait span lasts %d ns, want a positive length", wait.EndTimeUnixNano-wait.StartTimeUnixNano)
	}

	// The REST call: a server span under its traceparent, and its attempt.
	rest := find("GET /k/{key}/{path}", traceC)
	if len(rest) != 1 || hex.EncodeToString(rest[0].ParentSpanId) != spanC {
		t.Fatalf("spans %v: want one REST span under %s", names, spanC)
	}
	ra := attrs(rest[0])
	for k, want := range map[string]string{"http.request.method": "GET", "http.route": "/k/{key}/{path}",
		"http.response.status_code": "200", "mcp_quota.key": "qk"} {
		if ra[k] != want {
			t.Errorf("REST span: %s = %q, want %q", k, ra[k], want)
		}
	}
	var restAttempt *tracepb.Span
	for _, ch := range children(rest[0]) {
		if ch.Kind == tracepb.Span_SPAN_KIND_CLIENT {
			restAttempt = ch
		}
	}
	if restAttempt == nil {
		t.Fatalf("the REST span has no attempt span")
	}
	if tg := attrs(restAttempt)["mcp_quota.target"]; !strings.Contains(tg, "/items") || strings.Contains(tg, "api_key") {
		t.Errorf("REST attempt target %q, want the path without the query credential", tg)
	}

	lists := find("tools/list", traceD)
	if len(lists) != 1 {
		t.Fatalf("spans %v: want one tools/list in trace %s", names, traceD)
	}
	if a := attrs(lists[0]); a["mcp.session.id"] != session || a["jsonrpc.request.id"] != "list-1" || a["mcp.protocol.version"] != "2025-06-18" {
		t.Errorf("tools/list in a 2025-06-18 session: %v, want its session ID, request ID list-1 and the version", a)
	}

	// A JSON-RPC error answer: error.type is its code.
	var bad *tracepb.Span
	for _, sp := range rcv.spans {
		if attrs(sp)["jsonrpc.request.id"] == "bad-1" {
			bad = sp
		}
	}
	if bad == nil {
		t.Fatalf("spans %v: none for the call of an unknown tool", names)
	}
	if et := attrs(bad)["error.type"]; !regexp.MustCompile(`^-?[0-9]+$`).MatchString(et) || bad.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("the unknown tool's span: error.type %q, status %v; want the JSON-RPC error code and an error status", et, bad.Status)
	}

	// No exported byte holds a secret, in any form.
	for _, secret := range []string{bearerSecret, querySecret, agentToken, syncToken} {
		for _, form := range []string{secret, neturl.QueryEscape(secret), strings.ToUpper(secret)} {
			for i, b := range rcv.raw {
				if bytes.Contains(b, []byte(form)) {
					t.Errorf("export %d holds a secret (%s…)", i, secret[:6])
				}
			}
		}
	}
}

// TestTracesOverStdio: a stdio server (the built binary) traces too, its
// trace context from _meta, and sends what is left when its client
// closes it.
func TestTracesOverStdio(t *testing.T) {
	rcv := &otlpReceiver{names: map[string]bool{}}
	collector := httptest.NewServer(rcv)
	defer collector.Close()
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	s.env = append(s.env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="+collector.URL+"/v1/traces")
	sess := s.stdioSession(t, nil)
	const trace, parent = "7c1f0e2d3b4a59687766554433221100", "0123456789abcdef"
	res, err := sess.CallTool(t.Context(), &gomcp.CallToolParams{Name: "fetch", Arguments: map[string]any{"path": "/v1/participants"},
		Meta: gomcp.Meta{"traceparent": "00-" + trace + "-" + parent + "-01"}})
	if err != nil || res.IsError {
		t.Fatalf("fetch over stdio: %v %s", err, text(res))
	}
	if err := sess.Close(); err != nil { // the process ends, and sends its spans
		t.Logf("close: %v", err)
	}
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	var call *tracepb.Span
	for _, sp := range rcv.spans {
		if sp.Name == "tools/call fetch" && hex.EncodeToString(sp.TraceId) == trace {
			call = sp
		}
	}
	if call == nil {
		t.Fatalf("no 'tools/call fetch' span in trace %s among %d spans", trace, len(rcv.spans))
	}
	if a := attrs(call); hex.EncodeToString(call.ParentSpanId) != parent || a["network.transport"] != "pipe" {
		t.Errorf("stdio fetch span: parent %x, attributes %v; want parent %s and network.transport pipe", call.ParentSpanId, a, parent)
	}
	for i, b := range rcv.raw {
		for _, secret := range []string{upstreamSecret, agentToken, syncToken} {
			if bytes.Contains(b, []byte(secret)) {
				t.Errorf("export %d holds a secret", i)
			}
		}
	}
}
