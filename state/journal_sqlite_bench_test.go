package state

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// BenchmarkApplySQLite measures what the journal's applier costs on a
// SQLite state file to record routine outcomes (each a leased slot's
// call with one observation), by how many share a transaction: the
// process's CPU time per outcome, the statements and the commit. The
// slots are reserved first, 64 at a time, as leases reserve them; the
// file holds a history of 20,000 recorded calls.
//
//	go test -run '^$' -bench ApplySQLite ./state/
func BenchmarkApplySQLite(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{1, 4, 16, 64, 256} {
		b.Run(fmt.Sprint("batch=", n), func(b *testing.B) {
			db, err := Open(ctx, filepath.Join(b.TempDir(), "state.db"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { db.Close() })
			at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
			var fs []ledger.Finished
			reserve := func() {
				err := db.update(ctx, func(tx *Tx) error {
					at = at.Add(time.Millisecond)
					first, last, err := tx.Reserve("k", 64, at, at.Add(time.Minute))
					for id := first; err == nil && id <= last; id++ {
						fs = append(fs, routineOutcome(id, at))
					}
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			apply := func(fs []ledger.Finished) {
				err := db.update(ctx, func(tx *Tx) error {
					got, err := tx.finishAll(fs)
					if err == nil && got != len(fs) {
						err = fmt.Errorf("recorded %d of %d", got, len(fs))
					}
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			for len(fs) < 20_000 {
				reserve()
			}
			apply(fs)
			fs = fs[:0]
			var cpu time.Duration
			outcomes := 0
			for b.Loop() {
				b.StopTimer()
				for len(fs) < n {
					reserve()
				}
				b.StartTimer()
				start := applyCPU()
				apply(fs[:n])
				cpu += applyCPU() - start
				fs = fs[n:]
				outcomes += n
			}
			b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(outcomes), "cpu-µs/outcome")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/float64(outcomes), "µs/outcome")
		})
	}
}

// routineOutcome is how a leased slot's call, id, ended at at, with the
// one observation its answer carried.
func routineOutcome(id int64, at time.Time) ledger.Finished {
	return ledger.Finished{
		Attempt: ledger.Attempt{ID: id, Key: "k", CallID: fmt.Sprint("c", id), Attempt: 1, Caller: "sync",
			Transport: "rest", Method: "GET", Target: "/v1/items", State: ledger.Confirmed, Reason: reason.Reason{Kind: reason.Answered, Status: 200},
			Status: 200, SentAt: at, AnsweredAt: at.Add(20 * time.Millisecond)},
		Observations: []ledger.ObservationRecord{{Key: "k", AttemptID: id, Observation: ratelimit.Observation{
			Policy: "default", Unit: ratelimit.Requests, Quota: 1000, HasQuota: true, Window: time.Minute,
			Remaining: 900, HasRemaining: true, Reset: 30 * time.Second, HasReset: true, Shape: ratelimit.ShapeDraft},
			Status: 200, ReceivedAt: at.Add(20 * time.Millisecond), Method: "GET", Target: "/v1/items"}},
	}
}

// applyCPU returns the CPU time (user and system) this process has used.
func applyCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
