package main

import (
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/state"
)

// TestStateDiskBounded: over many REST calls through serve, the state
// file's write-ahead log stays within what the history needs (about
// MinCheckpointPages pages while the history is small) instead of growing
// towards CheckpointPages, and the history grows by a bounded number of
// bytes per recorded call (logged: the figure the documentation gives).
// How the log is checkpointed is tested in the state package, also under
// -short; this is the bound over many calls through a server.
func TestStateDiskBounded(t *testing.T) {
	t.Parallel()
	testkit.SkipShort(t, "800 calls through serve, to measure the state file on the disk")
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("RateLimit-Policy", `"default";q=100000;w=60`)
		w.Header().Set("RateLimit", `"default";r=99999;t=60`)
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(up.Close)
	key := demoKey(up.URL, 100000, time.Minute)
	key.MaxRate, key.MaxConcurrency = 100000, 8
	s := newSetup(t, key)
	base, _ := s.serve(t)
	size := func(p string) int64 {
		fi, err := os.Stat(p)
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	logical := func() int64 { // the history's size: the file's pages, with those still in the log
		t.Helper()
		db, err := sql.Open("sqlite", "file:"+s.state+"?_pragma=query_only(1)")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var pages, pageSize int64
		if err := db.QueryRow("PRAGMA page_count").Scan(&pages); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow("PRAGMA page_size").Scan(&pageSize); err != nil {
			t.Fatal(err)
		}
		return pages * pageSize
	}
	calls := func(n, from int) (largestLog int64) {
		for i := range n {
			resp := get(t, fmt.Sprintf("%s/k/demo/items/%d", base, from+i), syncToken)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("call %d: %s", from+i, resp.Status)
			}
			largestLog = max(largestLog, size(s.state+"-wal"))
		}
		return largestLog
	}
	const n = 400
	logA := calls(n, 0)
	after := logical()
	logB := calls(n, n)
	grown := logical() - after
	perCall := grown / n
	t.Logf("the history took %d bytes for %d calls: %d bytes per recorded call; the log at most %d bytes; the file %d bytes",
		grown, n, perCall, max(logA, logB), size(s.state))
	if most := int64(state.MinCheckpointPages+256) * (4096 + 24); max(logA, logB) > most {
		t.Errorf("the write-ahead log reached %d bytes over %d calls with a history of %d bytes; want at most %d", max(logA, logB), 2*n, logical(), most)
	}
	if perCall <= 0 || perCall > 16<<10 {
		t.Errorf("the history grew %d bytes per call; want a positive figure below 16 KiB", perCall)
	}
}
