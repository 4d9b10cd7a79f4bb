package state_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
)

// fillHistory is the history the FillHistory tests write: 7 attempts of
// two keys in turn, 100 ms apart.
var fillHistory = state.History{Keys: []string{"a", "b"}, N: 7, From: t0, Every: 100 * time.Millisecond,
	Latency: 20 * time.Millisecond, Status: 200, Caller: "history", Transport: "rest", Method: "GET", Target: "/items?page=1"}

// recordHistory records h in s one attempt at a time, through
// InsertAttempt and FinishAttempt, as the pacer would have.
func recordHistory(t *testing.T, s ledger.Store, h state.History) {
	t.Helper()
	for i := range h.N {
		key := h.Keys[i%len(h.Keys)]
		at := h.From.Add(time.Duration(i) * h.Every)
		err := s.Update(context.Background(), func(tx ledger.Tx) error {
			id, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint("h", i), Attempt: 1, Key: key, Caller: h.Caller,
				Transport: h.Transport, Method: h.Method, Target: h.Target, State: ledger.Admitted, At: at})
			if err != nil {
				return err
			}
			return tx.FinishAttempt(id, ledger.Confirmed, reason.Reason{Kind: reason.Answered, Status: h.Status}, h.Status,
				at, at.Add(h.Latency))
		}, key)
		if err != nil {
			t.Fatal(err)
		}
	}
}

// readLog returns what s holds of each of keys: its activity (without the IDs,
// which each back end takes as it does) and its sliding-window log seen
// from before from, after a next admission of each key 1 s after until.
func readLog(t *testing.T, s ledger.Store, keys []string, from, until time.Time) map[string]any {
	t.Helper()
	out := map[string]any{}
	err := s.Update(context.Background(), func(tx ledger.Tx) error {
		for _, key := range keys {
			if _, err := tx.InsertAttempt(ledger.Attempt{CallID: "next", Attempt: 1, Key: key, Caller: "next", Transport: "rest",
				Method: "GET", Target: "/", State: ledger.Admitted, At: until.Add(time.Second)}); err != nil {
				return err
			}
		}
		return nil
	}, keys...)
	if err != nil {
		t.Fatal(err)
	}
	err = s.View(context.Background(), func(tx ledger.ReadTx) error {
		for _, key := range keys {
			activity, err := tx.Activity(ledger.ActivityFilter{Key: key, Limit: 1000})
			if err != nil {
				return err
			}
			w, err := tx.WindowByCaller(key, from.Add(-time.Millisecond))
			if err != nil {
				return err
			}
			since, err := tx.Count(key, from.Add(150*time.Millisecond))
			if err != nil {
				return err
			}
			out[key] = struct {
				Activity []ledger.Attempt
				Window   ledger.Window
				Since    int
			}{activity, w, since}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// FillHistory writes what recording the same attempts one by one would
// have written: the same activity, the same window counts, numbered so
// that the next admission of each key follows its history; and refuses
// to write over a key's admissions.
func fillsAsRecorded(t *testing.T, open func(t *testing.T) (ledger.Store, string)) {
	ctx := context.Background()
	recorded, _ := open(t)
	recordHistory(t, recorded, fillHistory)
	filled, where := open(t)
	if err := state.FillHistory(ctx, where, fillHistory); err != nil {
		t.Fatal(err)
	}
	end := fillHistory.From.Add(time.Duration(fillHistory.N) * fillHistory.Every)
	want := readLog(t, recorded, fillHistory.Keys, fillHistory.From, end)
	got := readLog(t, filled, fillHistory.Keys, fillHistory.From, end)
	if diff := cmp.Diff(got, want, cmpopts.IgnoreFields(ledger.Attempt{}, "ID")); diff != "" {
		t.Errorf("the filled history (-got +want as recorded one by one):\n%s", diff)
	}
	if err := state.FillHistory(ctx, where, fillHistory); err == nil {
		t.Error("a second FillHistory over the same keys: no error, want one")
	}
}

func TestFillHistory(t *testing.T) {
	fillsAsRecorded(t, func(t *testing.T) (ledger.Store, string) {
		path := filepath.Join(t.TempDir(), "state.db")
		db, err := state.Open(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db, path
	})
}

// fillsAsRecordedOnPostgres is TestFillHistory on PostgreSQL.
func fillsAsRecordedOnPostgres(t *testing.T, srv *pgtest.Server) {
	fillsAsRecorded(t, func(t *testing.T) (ledger.Store, string) {
		url := srv.CreateDatabase(t)
		return openPostgres(t, url, state.PostgresOptions{}), url
	})
}
