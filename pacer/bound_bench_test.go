package pacer_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/conformance"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/state"
)

// BenchmarkFloodedKey measures one call's bookkeeping (Admit, then Done
// with an answer that shows one known policy) on a key whose upstream
// announced one policy, and on one whose upstream announced 64 new
// policies on each of 240 answers: the cost must not follow what the
// upstream ever announced.
//
//	go test -run '^$' -bench FloodedKey -benchtime 2000x ./pacer/
func BenchmarkFloodedKey(b *testing.B) {
	for _, tt := range []struct {
		name             string
		answers, perEach int
	}{{"policies=1", 1, 1}, {"policies=240x64", 240, 64}} {
		b.Run(tt.name, func(b *testing.B) {
			ctx := context.Background()
			db, err := state.Open(ctx, filepath.Join(b.TempDir(), "state.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			p := pacer.New(db)
			key := conformance.SharedKey(0, 0)
			call := pacer.Call{Key: key, Caller: "bench", Transport: "rest", Method: "GET", Target: "/items", CallID: "c", Attempt: 1, MaxWait: time.Second}
			answer := func(obs []ratelimit.Observation) {
				t, err := p.Admit(ctx, call)
				if err != nil {
					b.Fatal(err)
				}
				now := time.Now()
				rd := &ratelimit.Reading{ReceivedAt: now, Observations: obs}
				if _, err := p.Done(ctx, t, pacer.Outcome{SentAt: now, AnsweredAt: now, Status: 200, Reading: rd}); err != nil {
					b.Fatal(err)
				}
			}
			policy := func(name string) ratelimit.Observation {
				return ratelimit.Observation{Policy: name, Unit: ratelimit.Requests, Quota: 1_000_000, HasQuota: true, Window: time.Hour,
					Remaining: 1_000_000, HasRemaining: true, Reset: time.Hour, HasReset: true, Shape: ratelimit.ShapeDraft}
			}
			for i := range tt.answers {
				var obs []ratelimit.Observation
				for j := range tt.perEach {
					obs = append(obs, policy(fmt.Sprintf("p%d-%d", i, j)))
				}
				answer(obs)
			}
			shown := []ratelimit.Observation{policy(fmt.Sprintf("p%d-0", tt.answers-1))}
			b.ResetTimer()
			for range b.N {
				answer(shown)
			}
		})
	}
}
