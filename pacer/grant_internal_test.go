package pacer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/state"
)

// The admission that grants a lease changes nothing in memory before its
// transaction commits: between a run of it that was rolled back and the
// next, the Pacer holds no mark of a lease being granted (a mark other
// calls of the key would wait on, for a lease the last run may never
// grant).
func TestGrantChangesMemoryOnlyAfterCommit(t *testing.T) {
	ctx := context.Background()
	db, err := state.Open(ctx, testkit.StateFile(t, state.Open))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	store := &testkit.RerunStore{Store: db}
	clk := testkit.NewClock(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC))
	p := New(store, WithClock(clk), WithJitter(func() float64 { return 0.5 }))
	defer p.Close(ctx)
	k := &keystore.Key{Name: "k", MaxRate: 1e6, MaxConcurrency: 10_000,
		Policies: []keystore.Policy{{Name: "default", Quota: 100_000, Window: time.Minute, Unit: ratelimit.Requests}}}

	var marked []int // the admissions whose rolled-back run left a mark
	for i := range 20 {
		store.Once(func(context.Context) error {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.granting[k.Name] != nil {
				marked = append(marked, i)
			}
			return nil
		})
		tk, err := p.Admit(ctx, Call{Key: k, Caller: "sync", Transport: "rest", Method: "GET", Target: "/items",
			CallID: fmt.Sprintf("call-%d", i), Attempt: 1})
		if err != nil {
			t.Fatal(err)
		}
		if tk.Leased() {
			if len(marked) > 0 {
				t.Errorf("admissions %v marked the key as being granted a lease in a run that was rolled back, want none", marked)
			}
			return
		}
		at := clk.Now()
		if _, err := p.Done(ctx, tk, Outcome{SentAt: at, AnsweredAt: at, Status: 200}); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Millisecond)
	}
	t.Fatal("no call was admitted from a lease after 20 calls 1 ms apart")
}
