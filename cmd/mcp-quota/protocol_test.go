package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/demo"
)

// TestStreamableHTTPDetails drives a running serve by hand over the
// legacy handshake: a GET outside any session is 405, not a stream that
// never ends; a resource of no key of the caller's is "resource not
// found" (-32002), not an internal error; a session ended with DELETE
// answers 404.
func TestStreamableHTTPDetails(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	base, _ := s.serve(t, "--session-idle", "10m")
	do := func(method, session, body string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), method, base+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+agentToken)
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
			req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	resp, body := do(http.MethodGet, "", "")
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, POST, DELETE" {
		t.Errorf("GET without a session: %d, Allow %q: %s", resp.StatusCode, resp.Header.Get("Allow"), body)
	}
	resp, body = do(http.MethodPost, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"details","version":"1"}}}`)
	session := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || session == "" {
		t.Fatalf("initialize: %d, session %q: %s", resp.StatusCode, session, body)
	}
	do(http.MethodPost, session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	_, body = do(http.MethodPost, session, `{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"quota://activity/nokey"}}`)
	if !strings.Contains(body, `"code":-32002`) {
		t.Errorf("reading the activity of no key: %s, want error -32002", body)
	}
	_, body = do(http.MethodPost, session, `{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":"quota://activity/demo"}}`)
	if !strings.Contains(body, `"uri":"quota://activity/demo"`) {
		t.Errorf("reading the activity of the caller's key: %s", body)
	}
	if resp, body := do(http.MethodDelete, session, ""); resp.StatusCode != http.StatusOK {
		t.Errorf("DELETE: %d %s", resp.StatusCode, body)
	}
	if resp, body := do(http.MethodPost, session, `{"jsonrpc":"2.0","id":4,"method":"ping"}`); resp.StatusCode != http.StatusNotFound {
		t.Errorf("ping in the ended session: %d %s, want 404", resp.StatusCode, body)
	}
}
