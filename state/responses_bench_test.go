package state_test

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// BenchmarkPutResponse measures keeping one answer (the fetch tool's
// write after each 200) on an SQLite file, in its own transaction: for a
// key with a few stored answers, each put replacing one of them, and for a
// key at its limit of 32, each put a new target that pushes out the
// oldest (an agent paging through a long list).
//
//	go test -run '^$' -bench PutResponse ./state/
func BenchmarkPutResponse(b *testing.B) {
	const keep = 32
	for _, c := range []struct {
		name    string
		targets int // distinct targets the puts cycle through; 0: each new
	}{{"few", 4}, {"full", 0}} {
		b.Run(c.name, func(b *testing.B) {
			db, err := state.Open(context.Background(), filepath.Join(b.TempDir(), "state.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
			put := func(i int) {
				target := fmt.Sprintf("/v1/items?page=%d", i)
				if c.targets > 0 {
					target = fmt.Sprintf("/v1/items?page=%d", i%c.targets)
				}
				err := db.Update(context.Background(), func(tx ledger.Tx) error {
					return tx.PutResponse(ledger.StoredResponse{Key: "k", Target: target, Status: 200, ContentType: "application/json",
						Body: []byte(`{"items":[]}`), Digest: "d", StoredAt: t0.Add(time.Duration(i) * time.Millisecond)}, keep)
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			for i := range 2 * keep {
				put(i)
			}
			b.ResetTimer()
			for i := range b.N {
				put(2*keep + i)
			}
		})
	}
}

// BenchmarkKeepLater measures keeping the fetch tool's answers through the
// process's journal on an SQLite file, by how many of one key the
// applier keeps in one transaction: a key at its limit of 32, each answer
// a new target that pushes out the oldest (every fetch of
// BenchmarkFetch). The journal's linger runs on a clock that does not
// move, so each batch is what a View (which waits for the journal) finds
// queued. Reported: the process's CPU time per answer, the journal's
// line, the applier's statements and its commit together.
//
//	go test -run '^$' -bench KeepLater ./state/
func BenchmarkKeepLater(b *testing.B) {
	const keep = 32
	for _, n := range []int{1, 4, 16} {
		b.Run(fmt.Sprint("batch=", n), func(b *testing.B) {
			t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
			db, err := state.Open(context.Background(), filepath.Join(b.TempDir(), "state.db"), state.WithClock(testkit.NewClock(t0)))
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			i := 0
			batch := func() {
				for range n {
					r := ledger.StoredResponse{Key: "k", Target: fmt.Sprintf("/v1/echo?n=%d", i), Status: 200, ContentType: "application/json",
						Body: []byte(`{"method":"GET","path":"/v1/echo","query":{"n":["1"]},"authorization_present":true}`), Digest: "d",
						StoredAt: t0.Add(time.Duration(i) * time.Millisecond)}
					if err := db.KeepLater(context.Background(), r, keep, nil); err != nil {
						b.Fatal(err)
					}
					i++
				}
				if err := db.View(context.Background(), func(ledger.ReadTx) error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
			for range 2 * keep / n {
				batch()
			}
			var cpu time.Duration
			answers := 0
			for b.Loop() {
				start := processCPU()
				batch()
				cpu += processCPU() - start
				answers += n
			}
			b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(answers), "cpu-µs/answer")
		})
	}
}

// processCPU returns the CPU time (user and system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
