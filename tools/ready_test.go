package tools

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/state"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// TestReadyWaits: a server whose Deps are not ready yet answers
// initialize and lists its tools; a tool call and an activity read made
// then wait until another goroutine has set the state, pacer and client,
// and are served by them; with Ready failing, each call is an isError
// result with its reason and code stateUnavailable, and a read fails
// with it.
func TestReadyWaits(t *testing.T) {
	keys := parseKeys(t, testkit.Config{Keys: []testkit.Key{openKey("mine")}})
	rpc := func(s interface {
		HandleMessage(context.Context, json.RawMessage) mcp.JSONRPCMessage
	}, msg string) string {
		b, err := json.Marshal(s.HandleMessage(context.Background(), json.RawMessage(msg)))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	const (
		initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
		list       = `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
		status     = `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"quota_status","arguments":{}}}`
		read       = `{"jsonrpc":"2.0","id":4,"method":"resources/read","params":{"uri":"quota://activity/mine"}}`
	)

	t.Run("opened", func(t *testing.T) {
		open, waiting := make(chan struct{}), make(chan struct{}, 2)
		d := &Deps{Keys: keys, Ready: func(ctx context.Context) error {
			waiting <- struct{}{}
			select {
			case <-open:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}}
		s := NewServer(d, "test")
		if got := rpc(s, initialize); !strings.Contains(got, `"protocolVersion"`) {
			t.Fatalf("initialize before the state is open: %s", got)
		}
		if got := rpc(s, list); !strings.Contains(got, `"quota_status"`) || !strings.Contains(got, `"fetch"`) {
			t.Fatalf("tools/list before the state is open: %s", got)
		}
		answers := make(chan string, 2)
		go func() { answers <- rpc(s, status) }()
		go func() { answers <- rpc(s, read) }()
		for range 2 { // both calls wait in Ready
			select {
			case <-waiting:
			case got := <-answers:
				t.Fatalf("a call answered before the state was open: %s", got)
			}
		}
		db := testkit.OpenState(t, state.Open)
		p := pacer.New(db)
		d.DB, d.Pacer, d.Client = db, p, upstream.New(p, slog.New(slog.DiscardHandler))
		close(open)
		for range 2 {
			got := <-answers
			if strings.Contains(got, `"isError":true`) || strings.Contains(got, `"error"`) ||
				!strings.Contains(got, "mine") {
				t.Errorf("a call made before the state was open: %s; want it served once it is", got)
			}
		}
	})

	t.Run("failed", func(t *testing.T) {
		d := &Deps{Keys: keys, Ready: func(context.Context) error {
			return errors.New("the state file /x/state.db is not an SQLite database")
		}}
		s := NewServer(d, "test")
		rpc(s, initialize)
		got := rpc(s, status)
		if !strings.Contains(got, `"isError":true`) || !strings.Contains(got, `"code":"stateUnavailable"`) ||
			!strings.Contains(got, "The state file /x/state.db is not an SQLite database.") {
			t.Errorf("quota_status with a state that cannot open: %s", got)
		}
		if got := rpc(s, read); !strings.Contains(got, `"error"`) || !strings.Contains(got, "not an SQLite database") {
			t.Errorf("activity read with a state that cannot open: %s", got)
		}
	})
}
