package state_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// BenchmarkWindow measures one read of a key's sliding-window log (the
// count and the oldest send of a window), for logs of growing length, up
// to state.BenchRows sends, on both back ends: its cost does not grow with
// them. The count per caller that an admission reads for a key with
// reservations (of-callers: two reserving callers, from their numbered
// logs) does not either; the count of every caller (by-caller, for a
// status and the dashboard) grows with the window.
//
//	go test -run '^$' -bench Window ./state/
func BenchmarkWindow(b *testing.B) {
	reads := []struct {
		name string
		read func(ledger.ReadTx, string, time.Time) (ledger.Window, error)
	}{
		{"total", (ledger.ReadTx).Window},
		{"by-caller", (ledger.ReadTx).WindowByCaller},
		{"of-callers", func(tx ledger.ReadTx, key string, since time.Time) (ledger.Window, error) {
			return tx.WindowOf(key, since, []string{"caller0", "caller1"})
		}},
	}
	sizes := []int{100, 10_000, 100_000}
	if n := state.BenchRows(b); !slices.Contains(sizes, n) {
		sizes = append(sizes, n)
		slices.Sort(sizes)
	}
	// matrix measures every read of every size, the logs from open (made
	// once a size, for the back end's whole run).
	matrix := func(b *testing.B, open func(b *testing.B, n int) ledger.Viewer) {
		logs := map[int]ledger.Viewer{}
		for _, r := range reads {
			for _, n := range sizes {
				b.Run(fmt.Sprintf("%s/sends=%d", r.name, n), func(b *testing.B) {
					if logs[n] == nil {
						logs[n] = open(b, n)
					}
					benchWindow(b, logs[n], n, r.read)
				})
			}
		}
	}
	b.Run("store=sqlite", func(b *testing.B) {
		group := b
		matrix(b, func(b *testing.B, n int) ledger.Viewer {
			db, err := state.Open(context.Background(), filepath.Join(group.TempDir(), "state.db"))
			if err != nil {
				b.Fatal(err)
			}
			group.Cleanup(func() { db.Close() })
			for from := 0; from < n; from += 50_000 {
				err = db.Update(context.Background(), func(tx ledger.Tx) error {
					for i := from; i < min(from+50_000, n); i++ {
						if _, err := tx.InsertAttempt(ledger.Attempt{CallID: "c", Key: "k", Caller: fmt.Sprint("caller", i%3),
							State: ledger.Admitted, At: t0.Add(time.Duration(i) * time.Millisecond), CallerReserves: true}); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			return db
		})
	})
	b.Run("store=postgres", func(b *testing.B) {
		srv := pgtest.Start(b)
		b.Setenv("PGPASSWORD", srv.Password())
		group := b
		matrix(b, func(b *testing.B, n int) ledger.Viewer {
			url := srv.CreateDatabase(group)
			if err := state.FillWindow(context.Background(), url, n); err != nil {
				b.Fatal(err)
			}
			// Every read of a size runs in one transaction, which the
			// bound would end: the reads of a window of every caller take
			// longer than it.
			db, err := state.OpenPostgres(context.Background(), url, state.PostgresOptions{Timeout: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			group.Cleanup(func() { db.Close() })
			return db
		})
	})
}

// benchWindow measures read over all but the first of the n sends of
// three callers, a millisecond apart, that db holds.
func benchWindow(b *testing.B, db ledger.Viewer, n int, read func(ledger.ReadTx, string, time.Time) (ledger.Window, error)) {
	err := db.View(context.Background(), func(tx ledger.ReadTx) error {
		for b.Loop() {
			if w, err := read(tx, "k", t0); err != nil || w.Count != n-1 {
				return fmt.Errorf("window: %+v, %v", w, err)
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkUpdate measures a write transaction recording one admission
// and its key's pacing state: from one goroutine at a time, and from
// eight at once, whose Update calls share transactions and commits.
//
//	go test -run '^$' -bench Update ./state/
func BenchmarkUpdate(b *testing.B) {
	var n atomic.Int64
	record := func(db *state.DB) error {
		return db.Update(context.Background(), func(tx ledger.Tx) error {
			// Admissions are recorded in order of time, as the pacer does.
			at := t0.Add(time.Duration(n.Add(1)) * time.Microsecond)
			if _, err := tx.InsertAttempt(ledger.Attempt{CallID: "c", Key: "k", State: ledger.Admitted, At: at,
				InFlightUntil: at.Add(time.Minute)}); err != nil {
				return err
			}
			return tx.PutKeyState(ledger.KeyState{Key: "k", LastAdmitAt: at})
		})
	}
	for _, parallel := range []bool{false, true} {
		b.Run(fmt.Sprintf("parallel=%v", parallel), func(b *testing.B) {
			db, err := state.Open(context.Background(), filepath.Join(b.TempDir(), "state.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			if !parallel {
				for b.Loop() {
					if err := record(db); err != nil {
						b.Fatal(err)
					}
				}
				return
			}
			b.SetParallelism(4) // 8 goroutines on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := record(db); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
