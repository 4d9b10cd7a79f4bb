package state_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// BenchmarkWindow measures one read of a key's sliding-window log (the
// count and the oldest send of a window), for logs of growing length: its
// cost does not grow with them. The count per caller that an admission
// reads for a key with reservations (of-callers: two reserving callers,
// from their numbered logs) does not either; the count of every caller
// (by-caller, for a status) grows with the window.
//
//	go test -run '^$' -bench Window ./state/
func BenchmarkWindow(b *testing.B) {
	reads := []struct {
		name string
		read func(ledger.Tx, string, time.Time) (ledger.Window, error)
	}{
		{"total", (ledger.Tx).Window},
		{"by-caller", (ledger.Tx).WindowByCaller},
		{"of-callers", func(tx ledger.Tx, key string, since time.Time) (ledger.Window, error) {
			return tx.WindowOf(key, since, []string{"caller0", "caller1"})
		}},
	}
	for _, r := range reads {
		for _, n := range []int{100, 10_000, 100_000} {
			b.Run(fmt.Sprintf("%s/sends=%d", r.name, n), func(b *testing.B) { benchWindow(b, n, r.read) })
		}
	}
}

// benchWindow fills a log with n sends of three callers, a millisecond
// apart, and measures read over all but the first.
func benchWindow(b *testing.B, n int, read func(ledger.Tx, string, time.Time) (ledger.Window, error)) {
	db, err := state.Open(context.Background(), filepath.Join(b.TempDir(), "state.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	err = db.Update(context.Background(), func(tx ledger.Tx) error {
		for i := range n {
			if _, err := tx.InsertAttempt(ledger.Attempt{CallID: "c", Key: "k", Caller: fmt.Sprint("caller", i%3),
				State: ledger.Admitted, At: t0.Add(time.Duration(i) * time.Millisecond), ByCaller: true}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	err = db.View(context.Background(), func(tx ledger.Tx) error {
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
				LeaseUntil: at.Add(time.Minute)}); err != nil {
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
