package main

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
)

// TestStdioAnswersWhileStateOpens: `mcp-quota stdio` answers initialize
// and lists its tools while its state file is still being opened — here
// held back by another process's write transaction, which the schema's
// migration must wait for — and a tool call made once the file is free
// waits for the state and is served by it.
func TestStdioAnswersWhileStateOpens(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	// An SQLite file with no schema yet, its write lock held here.
	other, err := sql.Open("sqlite", s.state+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(t.Context(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	sess := s.stdioSession(t, nil)
	list, err := sess.ListTools(t.Context(), nil)
	if err != nil || len(list.Tools) != 2 {
		t.Fatalf("tools/list while the state opens: %v, %v; want fetch and quota_status", list, err)
	}
	if _, err := conn.ExecContext(t.Context(), "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	res, err := sess.CallTool(t.Context(), &gomcp.CallToolParams{Name: "quota_status", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || res.StructuredContent == nil || !strings.Contains(text(res), "demo") {
		t.Errorf("quota_status once the file is free: isError %v, text %q; want the key's status", res.IsError, text(res))
	}
}
