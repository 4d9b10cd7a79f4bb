package state_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// historyRows is the size of the history the growth benchmarks read and
// sweep: a sync job's week at its limit is about 1.2 million attempts.
// MCP_QUOTA_BENCH_ROWS sets another.
func historyRows(b *testing.B) int {
	if s := os.Getenv("MCP_QUOTA_BENCH_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatal(err)
		}
		return n
	}
	return 2_000_000
}

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
					if err := tx.FinishAttempt(id, ledger.Confirmed, "", 200, at, at.Add(20*time.Millisecond)); err != nil {
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

// end is the instant after the history's last attempt.
func historyEnd(n int) time.Time { return t0.Add(time.Duration(n) * 100 * time.Millisecond) }

// BenchmarkActivity reads one page of a key's activity at the end of a
// long history: the quiet key, the busy key, and each with since= an hour
// before the end. Its cost is the page's, not the history's.
//
//	go test -run '^$' -bench Activity -benchtime 200x ./state/
func BenchmarkActivity(b *testing.B) {
	n := historyRows(b)
	db, err := state.Open(context.Background(), history(b, n))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	hour := historyEnd(n).Add(-time.Hour)
	for _, f := range []ledger.ActivityFilter{
		{Key: "quiet"}, {Key: "busy"}, {Key: "quiet", Since: hour}, {Key: "busy", Since: hour}, {},
	} {
		name := fmt.Sprintf("key=%s/since=%v", f.Key, !f.Since.IsZero())
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				err := db.View(context.Background(), func(tx ledger.Tx) error {
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
// not what the file holds.
//
//	go test -run '^$' -bench Sweep -benchtime 20x ./state/
func BenchmarkSweep(b *testing.B) {
	n := historyRows(b)
	b.Run("nothing", func(b *testing.B) {
		db, err := state.Open(context.Background(), copyHistory(b, n))
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		for b.Loop() {
			if got, err := db.Sweep(context.Background(), historyEnd(n), t0); err != nil || got.Attempts != 0 {
				b.Fatalf("swept %+v, %v", got, err)
			}
		}
	})
	b.Run("10000", func(b *testing.B) {
		db, err := state.Open(context.Background(), copyHistory(b, n))
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		i := 0
		for b.Loop() {
			i++
			before := t0.Add(time.Duration(i) * 10_000 * 100 * time.Millisecond)
			if got, err := db.Sweep(context.Background(), historyEnd(n), before); err != nil || got.Attempts != 10_000 {
				b.Fatalf("sweep %d: swept %+v, %v; want 10000 attempts", i, got, err)
			}
		}
	})
}
