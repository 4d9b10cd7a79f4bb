package main

import (
	"bytes"
	"database/sql"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
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
	s.state = filepath.Join(t.TempDir(), "state.db")
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

// answerWatch is stdio's stdout in TestStdioOpensStateAfterAnswer: it
// notes whether the state file exists when the first answer is written.
type answerWatch struct {
	io.WriteCloser
	state string
	first sync.Once
	found chan bool // whether the file existed at the first write
}

func (w *answerWatch) Write(p []byte) (int, error) {
	w.first.Do(func() {
		_, err := os.Stat(w.state)
		w.found <- err == nil
	})
	return w.WriteCloser.Write(p)
}

// TestStdioOpensStateAfterAnswer: `mcp-quota stdio` begins opening its
// state only once its first answer (to initialize) is written — the
// state file does not exist yet when that answer goes out — and a tool
// call then is served by the state, which it creates.
func TestStdioOpensStateAfterAnswer(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	s.state = filepath.Join(t.TempDir(), "state.db") // none yet
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	out := &answerWatch{WriteCloser: outW, state: s.state, found: make(chan bool, 1)}
	done := make(chan error, 1)
	go func() {
		done <- run(t.Context(), []string{"stdio", "--config", s.config, "--state", s.state}, inR, out, io.Discard, s.getenv)
		outW.Close()
	}()
	client := gomcp.NewClient(&gomcp.Implementation{Name: "e2e", Version: "1"}, nil)
	sess, err := client.Connect(t.Context(), &gomcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if <-out.found {
		t.Errorf("the state file %s existed when the answer to initialize was written; want it opened after", s.state)
	}
	res, err := sess.CallTool(t.Context(), &gomcp.CallToolParams{Name: "quota_status", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || !strings.Contains(text(res), "demo") {
		t.Errorf("quota_status: isError %v, text %q; want the key's status", res.IsError, text(res))
	}
	if _, err := os.Stat(s.state); err != nil {
		t.Errorf("after a tool call: %v; want the state file made", err)
	}
	sess.Close()
	if err := <-done; err != nil {
		t.Errorf("stdio: %v", err)
	}
}

// TestOpeningBegins: an opening begins at the first write through the
// writer answered returns (not before), or when a call waits for it;
// it begins once; and closing an opening that never began opens nothing.
func TestOpeningBegins(t *testing.T) {
	newOpening := func(runs *atomic.Int32) *opening {
		return &opening{done: make(chan struct{}), run: func(o *opening) {
			runs.Add(1)
			close(o.done)
		}}
	}
	t.Run("first answer", func(t *testing.T) {
		var runs atomic.Int32
		o := newOpening(&runs)
		var buf bytes.Buffer
		w := o.answered(&buf)
		select {
		case <-o.done:
			t.Fatal("the opening began before any answer")
		default:
		}
		for range 3 {
			if _, err := io.WriteString(w, "{}\n"); err != nil {
				t.Fatal(err)
			}
		}
		if err := o.wait(t.Context()); err != nil {
			t.Fatal(err)
		}
		o.close()
		if got := runs.Load(); got != 1 || buf.String() != "{}\n{}\n{}\n" {
			t.Errorf("runs %d, written %q; want 1 run and the three answers", got, buf.String())
		}
	})
	t.Run("a call waits", func(t *testing.T) {
		var runs atomic.Int32
		o := newOpening(&runs)
		if err := o.wait(t.Context()); err != nil {
			t.Fatal(err)
		}
		o.close()
		if got := runs.Load(); got != 1 {
			t.Errorf("runs %d; want 1", got)
		}
	})
	t.Run("never began", func(t *testing.T) {
		var runs atomic.Int32
		o := newOpening(&runs)
		o.close()
		if err := o.wait(t.Context()); err != nil {
			t.Fatal(err)
		}
		if got := runs.Load(); got != 0 {
			t.Errorf("runs %d; want none", got)
		}
	})
}
