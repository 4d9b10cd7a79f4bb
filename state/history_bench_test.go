package state_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
)

// The growth benchmarks read and sweep a history of state.BenchRows
// attempts (2 million unless MCP_QUOTA_BENCH_ROWS says otherwise) on both
// back ends: a state file written once per run and copied for each
// benchmark that changes it, and a PostgreSQL database of the same shape
// (state.PostgresHistory), written once per benchmark and copied the
// same way.

var (
	historyOnce sync.Once
	historyFile string
	historyErr  error
)

// history returns a state file holding n attempts, written once per run
// and copied for each benchmark that changes it: a busy key with one
// attempt every 100 ms over the whole span and a quiet key with one every
// 1,000th, and an observation and a warning every 100th.
func history(b *testing.B, n int) string {
	b.Helper()
	historyOnce.Do(func() {
		dir, err := os.MkdirTemp("", "mcp-quota-history")
		if err != nil {
			historyErr = err
			return
		}
		historyFile = filepath.Join(dir, "state.db")
		db, err := state.Open(context.Background(), historyFile)
		if err != nil {
			historyErr = err
			return
		}
		defer db.Close()
		for from := 0; from < n && historyErr == nil; from += 50_000 {
			historyErr = db.Update(context.Background(), func(tx ledger.Tx) error {
				for i := from; i < min(from+50_000, n); i++ {
					key, caller := "busy", "sync"
					if i%1000 == 0 {
						key, caller = "quiet", "agent"
					}
					at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
					id, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint("c", i), Attempt: 1, Key: key, Caller: caller,
						Transport: "rest", Method: "GET", Target: "/v1/participants?limit=500", State: ledger.Admitted, At: at})
					if err != nil {
						return err
					}
					if err := tx.FinishAttempt(id, ledger.Confirmed, reason.Reason{Kind: reason.Answered, Status: 200}, 200, at, at.Add(20*time.Millisecond)); err != nil {
						return err
					}
					if i%100 != 0 {
						continue
					}
					if err := tx.AddObservation(ledger.ObservationRecord{Key: key, AttemptID: id, Observation: ratelimit.Observation{
						Policy: "default", Unit: ratelimit.Requests, Quota: 120, HasQuota: true, Window: time.Minute,
						Remaining: 100, HasRemaining: true, Reset: 30 * time.Second, HasReset: true, Shape: ratelimit.ShapeDraft,
						Profile: "ietf"}, Status: 200, ReceivedAt: at.Add(20 * time.Millisecond), Method: "GET",
						Target: "/v1/participants?limit=500"}); err != nil {
						return err
					}
					if err := tx.AddWarning(ledger.Warning{Key: key, At: at, Kind: "hidden-limit",
						Reason: reason.Reason{Kind: reason.HiddenLimit, Key: key, Policy: "hidden", Limit: 100, Window: 10 * time.Second}}); err != nil {
						return err
					}
				}
				return nil
			})
		}
	})
	if historyErr != nil {
		b.Fatal(historyErr)
	}
	return historyFile
}

// historyEnd is the instant after the history's last attempt.
func historyEnd(n int) time.Time { return t0.Add(time.Duration(n) * 100 * time.Millisecond) }

// onBothStores runs bench on a history of n attempts in each back end:
// open opens it (a copy, when writable) for one sub-benchmark.
func onBothStores(b *testing.B, n int, bench func(b *testing.B, open func(b *testing.B, writable bool) state.Store)) {
	b.Run("store=sqlite", func(b *testing.B) {
		bench(b, func(b *testing.B, writable bool) state.Store {
			path := history(b, n)
			if writable {
				path = copyHistory(b, n)
			}
			db, err := state.Open(context.Background(), path)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { db.Close() })
			return db
		})
	})
	b.Run("store=postgres", func(b *testing.B) {
		h := state.StartPostgresHistory(b, n)
		bench(b, func(b *testing.B, writable bool) state.Store {
			url := h.URL()
			if writable {
				url = h.Copy(b)
			}
			db, err := state.OpenPostgres(context.Background(), url, state.PostgresOptions{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { db.Close() })
			return db
		})
	})
}

// BenchmarkActivity reads one page of a key's activity at the end of a
// long history: the quiet key, the busy key, and each with since= an hour
// before the end. Its cost is the page's, not the history's.
//
//	go test -run '^$' -bench Activity -benchtime 200x ./state/
func BenchmarkActivity(b *testing.B) {
	n := state.BenchRows(b)
	hour := historyEnd(n).Add(-time.Hour)
	onBothStores(b, n, func(b *testing.B, open func(*testing.B, bool) state.Store) {
		db := open(b, false)
		for _, f := range []ledger.ActivityFilter{
			{Key: "quiet"}, {Key: "busy"}, {Key: "quiet", Since: hour}, {Key: "busy", Since: hour}, {},
		} {
			name := fmt.Sprintf("key=%s/since=%v", f.Key, !f.Since.IsZero())
			b.Run(name, func(b *testing.B) {
				for b.Loop() {
					err := db.View(context.Background(), func(tx ledger.ReadTx) error {
						list, err := tx.Activity(f)
						if err == nil && len(list) == 0 {
							err = fmt.Errorf("no activity")
						}
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	})
}

// BenchmarkDashboardReads reads what the dashboard shows of a key at the
// end of a long history: the busy key's timeline over its last two
// minutes in steps of 5 s (every poll of an open page), and one call with
// what its answer said (a click on it).
//
//	go test -run '^$' -bench DashboardReads ./state/
func BenchmarkDashboardReads(b *testing.B) {
	n := state.BenchRows(b)
	end := historyEnd(n)
	onBothStores(b, n, func(b *testing.B, open func(*testing.B, bool) state.Store) {
		db := open(b, false)
		reads := []struct {
			name string
			read func(ledger.ReadTx) (int, error)
		}{
			{"timeline", func(tx ledger.ReadTx) (int, error) {
				buckets, err := tx.Timeline("busy", end.Add(-2*time.Minute), 5*time.Second)
				return len(buckets), err
			}},
			{"call", func(tx ledger.ReadTx) (int, error) {
				i := n/2 + 1 // a busy call with an observation: i % 100 == 0 and i % 1000 != 0
				i -= i % 100
				if i%1000 == 0 {
					i += 100
				}
				list, err := tx.Call("busy", fmt.Sprint("c", i))
				if err != nil || len(list) != 1 {
					return 0, fmt.Errorf("call c%d: %v, %v", i, list, err)
				}
				obs, err := tx.ObservationsOf("busy", list[0].ID)
				return len(obs), err
			}},
		}
		for _, r := range reads {
			b.Run(r.name, func(b *testing.B) {
				for b.Loop() {
					err := db.View(context.Background(), func(tx ledger.ReadTx) error {
						got, err := r.read(tx)
						if err == nil && got == 0 {
							err = fmt.Errorf("%s: nothing read", r.name)
						}
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	})
}

// copyHistory copies the history's state file for a benchmark that
// changes it.
func copyHistory(b *testing.B, n int) string {
	b.Helper()
	src := history(b, n)
	dst := filepath.Join(b.TempDir(), "state.db")
	for _, suffix := range []string{"", "-wal"} {
		data, err := os.ReadFile(src + suffix)
		if os.IsNotExist(err) && suffix != "" {
			continue
		}
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(dst+suffix, data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	return dst
}

// BenchmarkSweep sweeps a long history: "nothing" when nothing is older
// than the retention (what the sweep costs every ten minutes at the
// plateau), "10000" when each sweep deletes the next 10,000 attempts (and
// their share of observations and warnings). Both cost what they delete,
// not what the history holds.
//
//	go test -run '^$' -bench Sweep -benchtime 20x ./state/
func BenchmarkSweep(b *testing.B) {
	n := state.BenchRows(b)
	onBothStores(b, n, func(b *testing.B, open func(*testing.B, bool) state.Store) {
		b.Run("nothing", func(b *testing.B) {
			db := open(b, true)
			for b.Loop() {
				if got, err := db.Sweep(context.Background(), historyEnd(n), t0); err != nil || got.Attempts != 0 {
					b.Fatalf("swept %+v, %v", got, err)
				}
			}
		})
		b.Run("10000", func(b *testing.B) {
			db := open(b, true)
			i := 0
			for b.Loop() {
				i++
				if i*10_000 > n {
					b.Fatalf("a history of %d attempts holds %d sweeps of 10,000: ask for at most -benchtime %dx, or more rows with MCP_QUOTA_BENCH_ROWS",
						n, n/10_000, n/10_000)
				}
				before := t0.Add(time.Duration(i) * 10_000 * 100 * time.Millisecond)
				if got, err := db.Sweep(context.Background(), historyEnd(n), before); err != nil || got.Attempts != 10_000 ||
					got.Observations != 100 || got.Warnings != 100 {
					b.Fatalf("sweep %d: swept %+v, %v; want 10000 attempts, 100 observations and 100 warnings", i, got, err)
				}
			}
		})
	})
}
