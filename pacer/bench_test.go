package pacer_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/state"
)

// The benchmark key's documented policy: generous enough that admission
// never waits, short enough that the sliding-window log a decision counts
// holds a realistic few hundred sends.
const (
	benchQuota  = 5000
	benchWindow = 100 * time.Millisecond
)

// BenchmarkAdmitDone measures one call's bookkeeping (Admit, then Done
// with an answer carrying one RateLimit observation) on one key of a
// state file, alone and while a second process hammers the same key.
//
//	go test -run '^$' -bench . -benchtime 5s ./pacer/
func BenchmarkAdmitDone(b *testing.B) {
	for _, procs := range []int{1, 2} {
		b.Run(fmt.Sprintf("procs=%d", procs), func(b *testing.B) { benchAdmit(b, procs, true) })
	}
}

// BenchmarkAdmit measures admission alone (the attempt stays in flight
// until its short lease runs out).
func BenchmarkAdmit(b *testing.B) {
	for _, procs := range []int{1, 2} {
		b.Run(fmt.Sprintf("procs=%d", procs), func(b *testing.B) { benchAdmit(b, procs, false) })
	}
}

// BenchmarkAdmitDonePostgres is BenchmarkAdmitDone on a PostgreSQL state
// on loopback, with 1 and 3 hosts (processes, each with its own pool) on
// the key.
//
//	go test -run '^$' -bench Postgres -benchtime 5s ./pacer/
func BenchmarkAdmitDonePostgres(b *testing.B) {
	srv := pgtest.Start(b)
	b.Setenv("PGPASSWORD", srv.Password())
	for _, window := range []time.Duration{benchWindow, leasedWindow} {
		for _, hosts := range []int{1, 3} {
			b.Run(fmt.Sprintf("window=%s/hosts=%d", window, hosts), func(b *testing.B) {
				benchAdmitAt(b, srv.CreateDatabase(b), hosts, true, window)
			})
		}
	}
}

// leasedWindow is a window long enough for leases (see pacer.LeaseTime):
// a process at a high pace then admits most calls from a batch of slots
// it reserved, one transaction for many.
const leasedWindow = 10 * time.Second

func benchAdmit(b *testing.B, procs int, done bool) {
	benchAdmitAt(b, filepath.Join(b.TempDir(), "state.db"), procs, done, benchWindow)
}

// benchAdmitAt runs the benchmark on the state at path (a file or a
// PostgreSQL URL), with procs processes on a key whose policy allows
// benchQuota calls per benchWindow, at that pace over window.
func benchAdmitAt(b *testing.B, path string, procs int, done bool, window time.Duration) {
	quota := int64(float64(benchQuota) * float64(window) / float64(benchWindow))
	ctx := context.Background()
	journals := b.TempDir() // each host's journals of a PostgreSQL state
	b.Setenv("PACER_JOURNAL", journals)
	db, err := state.OpenStore(ctx, path, state.PostgresOptions{JournalDir: journals})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	p := pacer.New(db)
	if pg, ok := db.(*state.Postgres); ok {
		p.Now = pg.Now
	}
	p.Lease = 10 * time.Millisecond
	key := hammerKey(quota, window)
	var others []*helper
	for i := 1; i < procs; i++ {
		h, _ := startHelper(b, helperConfig{Path: path, Caller: fmt.Sprintf("other%d", i), Quota: quota,
			Window: window, Lease: p.Lease, AdmitOnly: !done, Quiet: true})
		others = append(others, h)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		t, err := p.Admit(ctx, pacer.Call{Key: key, Caller: "bench", Transport: "rest", Method: "GET",
			Target: "/items?page=1", CallID: "c", Attempt: 1, MaxWait: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		if done {
			now := time.Now()
			rd := &ratelimit.Reading{ReceivedAt: now, Observations: []ratelimit.Observation{{
				Policy: "default", Unit: ratelimit.Requests, Quota: quota, HasQuota: true, Window: window,
				Remaining: 1_000_000, HasRemaining: true, Reset: time.Minute, HasReset: true, Shape: ratelimit.ShapeDraft}}}
			if _, err := p.Done(ctx, t, pacer.Outcome{SentAt: now, AnsweredAt: now, Status: 200, Reading: rd}); err != nil {
				b.Fatal(err)
			}
		}
		lat = append(lat, time.Since(t0))
	}
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	total := float64(b.N)
	for _, h := range others {
		n := h.stop(b)
		total += float64(n)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "max-µs")
	b.ReportMetric(total/elapsed.Seconds(), "calls/s-all-procs")
	// CPU time (user and system) this process spent per call: what a call
	// costs, whatever else the machine is doing.
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
}

// cpuTime returns the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
