package state_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func open(t *testing.T, path string, opts ...state.Option) *state.DB {
	t.Helper()
	db, err := state.Open(context.Background(), path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// update runs fn in an Update of s holding keys, failing t on an error.
func update(t *testing.T, s ledger.Store, fn func(ledger.Tx) error, keys ...string) {
	t.Helper()
	if err := s.Update(context.Background(), fn, keys...); err != nil {
		t.Fatal(err)
	}
}

func sweep(t *testing.T, db *state.DB, now, before time.Time) state.Swept {
	t.Helper()
	n, err := db.Sweep(context.Background(), now, before)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// view runs fn in a View of s, failing t on an error.
func view(t *testing.T, s ledger.Viewer, fn func(ledger.ReadTx) error) {
	t.Helper()
	if err := s.View(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}

func TestOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b", "state.db")
	db := open(t, path)
	if db.Path() != path {
		t.Errorf("Path() = %q, want %q", db.Path(), path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode: got %v, want 0600", fi.Mode().Perm())
	}
	update(t, db, func(tx ledger.Tx) error {
		_, err := tx.InsertAttempt(ledger.Attempt{CallID: "c", Attempt: 1, Key: "k", State: ledger.Admitted, At: t0})
		return err
	})
	// The log and the shared memory beside it hold the same history: they
	// are no more readable than the file.
	for _, side := range []string{path + "-wal", path + "-shm"} {
		fi, err := os.Stat(side)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode: got %v, want 0600", filepath.Base(side), fi.Mode().Perm())
		}
	}
	// Opened again (another process): the schema is not applied twice and
	// what was written is there.
	other := open(t, path)
	view(t, other, func(tx ledger.ReadTx) error {
		n, err := tx.Count("k", time.Time{})
		if n != 1 {
			t.Errorf("count in the file opened again: got %d, want 1", n)
		}
		return err
	})
	if problems, err := other.IntegrityCheck(context.Background()); err != nil || len(problems) > 0 {
		t.Errorf("IntegrityCheck: %v %q", err, problems)
	}
}

// TestSweepGivesSpaceBack: after a sweep deletes most of a file's history,
// the file itself shrinks (incremental auto-vacuum), a megabyte a
// transaction.
func TestSweepGivesSpaceBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db := open(t, path)
	target := "/v1/items?" + strings.Repeat("q=x&", 200)
	const attempts = 8000 // about 7 MB: the sweep deletes in many batches, and gives back a megabyte at a time many times
	update(t, db, func(tx ledger.Tx) error {
		for i := range attempts {
			if _, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint(i), Key: "k", Caller: "sync", Target: target,
				State: ledger.Confirmed, At: t0.Add(time.Duration(i) * time.Millisecond)}); err != nil {
				return err
			}
		}
		return nil
	})
	before := pages(t, path)
	sweep(t, db, t0.Add(time.Hour), t0.Add(attempts*95/100*time.Millisecond))
	after := pages(t, path)
	t.Logf("pages: %d before the sweep, %d after", before, after)
	if after > before/4 {
		t.Errorf("the file has %d pages after sweeping 95%% of its attempts, %d before; want it to shrink", after, before)
	}
}

// pages is the file's size in pages, read from its own header by another
// connection.
func pages(t *testing.T, path string) int {
	t.Helper()
	s := openScan(t, path)
	var n int
	if err := s.db.QueryRow("PRAGMA page_count").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// An attempt's wait is never read as negative: one an older version
// recorded on PostgreSQL with a negative wait (its two instants on two
// clocks) reads as none; others read as recorded.
func TestAttemptWaitNeverReadNegative(t *testing.T) {
	db := open(t, filepath.Join(t.TempDir(), "state.db"))
	waits := []time.Duration{-263 * time.Millisecond, 0, 1500 * time.Microsecond, 2 * time.Second}
	update(t, db, func(tx ledger.Tx) error {
		for i, w := range waits {
			if _, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint("c", i), Attempt: 1, Key: "k",
				State: ledger.RejectedLocal, At: t0.Add(time.Duration(i) * time.Second), Wait: w}); err != nil {
				return err
			}
		}
		return nil
	}, "k")
	got := map[string]time.Duration{}
	view(t, db, func(tx ledger.ReadTx) error {
		list, err := tx.Activity(ledger.ActivityFilter{Key: "k", Limit: 10})
		for _, a := range list {
			got[a.CallID] = a.Wait
		}
		return err
	})
	for i, w := range waits {
		if want := max(w, 0); got[fmt.Sprint("c", i)] != want {
			t.Errorf("recorded with wait %v: read %v, want %v", w, got[fmt.Sprint("c", i)], want)
		}
	}
}
