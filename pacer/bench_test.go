package pacer_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/conformance"
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
// until its short in-flight timeout runs out).
func BenchmarkAdmit(b *testing.B) {
	for _, procs := range []int{1, 2} {
		b.Run(fmt.Sprintf("procs=%d", procs), func(b *testing.B) { benchAdmit(b, procs, false) })
	}
}

// benchAdmit runs the benchmark on a new state file, with procs
// processes on a key whose policy allows benchQuota calls per benchWindow.
func benchAdmit(b *testing.B, procs int, done bool) {
	path := filepath.Join(b.TempDir(), "state.db")
	quota, window := int64(benchQuota), benchWindow
	ctx := context.Background()
	db, err := state.Open(ctx, path)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	inFlight := 10 * time.Millisecond
	p := pacer.New(db, pacer.WithInFlightTimeout(inFlight))
	key := conformance.SharedKey(quota, window)
	var others []*conformance.Helper
	for i := 1; i < procs; i++ {
		h := conformance.StartHelper(b, sqlite, conformance.Job{Location: path, Caller: fmt.Sprintf("other%d", i), Quota: quota,
			Window: window, InFlightTimeout: inFlight, AdmitOnly: !done, Quiet: true})
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
		n := h.Stop(b)
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
