package dashboard

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
)

// Who spends a window: callers by calls, and each reservation held back
// while its caller is active (it called, or is waiting) and lent while
// it is idle — as the pacer treats them.
func TestSpenders(t *testing.T) {
	k := &keystore.Key{Name: "k", Reserves: []keystore.Reserve{{Caller: "agent", Share: 0.25}, {Caller: "batch", Share: 0.5}, {Caller: "night", Share: 0.1}}}
	win := ledger.Window{Count: 40, ByCaller: map[string]int{"sync": 30, "agent": 10}}
	got := spenders(k, win, map[string]bool{"night": true}, 100)
	want := []spender{
		{Caller: "sync", Used: 30, Share: 0.75},
		{Caller: "agent", Used: 10, Share: 0.25, Reserved: 25, Held: 15},
		{Caller: "batch", Reserved: 50, Lent: 50},
		{Caller: "night", Reserved: 10, Held: 10},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("spenders (-want +got):\n%s", diff)
	}
}

// Every state has its series, and the upstream's refusals for quota (429)
// are apart from its other 4xx answers (a 404 is not a refusal).
func TestOutcomeCoversEveryState(t *testing.T) {
	for b, want := range map[ledger.Bucket]string{{State: ledger.Confirmed}: "sent", {State: ledger.Accepted}: "sent",
		{State: ledger.RejectedUpstream, Status: 429}: "refused_upstream", {State: ledger.RejectedUpstream, Status: 404}: "answered_error",
		{State: ledger.RejectedUpstream, Status: 403}: "answered_error",
		{State: ledger.RejectedLocal}:                 "refused_locally", {State: ledger.Cached}: "kept_copy", {State: ledger.Interrupted}: "interrupted",
		{State: ledger.Released}: "interrupted", {State: ledger.Failed}: "failed", {State: ledger.Admitted}: "in_flight"} {
		got := outcome(b)
		if got != want {
			t.Errorf("outcome(%s %d) = %s, want %s", b.State, b.Status, got, want)
		}
		if !slices.Contains(series, got) {
			t.Errorf("outcome(%s %d) = %s, which the timeline has no series for", b.State, b.Status, got)
		}
	}
}

// The budget's line is q less the sends of the window ending with each
// step, never below 0; ahead of now (no sends) the calls come back.
func TestLeftPerStep(t *testing.T) {
	// A window of 3 steps: the 3 before the chart, 3 shown, 3 ahead.
	counted := []int64{4, 0, 1, 5, 0, 0, 0, 0, 0}
	got := leftPerStep(counted, 3, 5)
	want := []int64{0, 0, 0, 5, 5, 5}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("leftPerStep (-want +got):\n%s", diff)
	}
}

// When the calls of a window come back: the first whole second in which
// any leaves (and how many leave by then), and the second the last one
// does — after w and the pacer's longest margin, never before.
func TestFrees(t *testing.T) {
	db, err := state.Open(context.Background(), testkit.StateFile(t, state.Open))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	t0 := time.Date(2026, 12, 1, 18, 41, 8, 0, time.UTC)
	sends := []time.Duration{-time.Minute, 200 * time.Millisecond, 500 * time.Millisecond, 700 * time.Millisecond, 10300 * time.Millisecond, 30 * time.Second}
	err = db.Update(context.Background(), func(tx ledger.Tx) error {
		for i, d := range sends {
			st := ledger.Admitted
			if i == 3 {
				st = ledger.RejectedLocal // refused: never counted
			}
			id, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint(i), Attempt: 1, Key: "k", Caller: "c", State: st, At: t0.Add(d)})
			if err != nil {
				return err
			}
			if st == ledger.Admitted {
				if err := tx.FinishAttempt(id, ledger.Confirmed, reason.Reason{Kind: reason.Answered, Status: 200}, 200, t0.Add(d), t0.Add(d)); err != nil {
					return err
				}
			}
		}
		return nil
	}, "k")
	if err != nil {
		t.Fatal(err)
	}
	now := t0.Add(40 * time.Second)
	stay := time.Minute + pacer.MaxMargin
	var got, none freeing
	err = db.View(context.Background(), func(tx ledger.ReadTx) error {
		var err error
		got, err = frees(tx, "k", report.Local{Policy: "default", Limit: 20, WindowS: 60}, now)
		if err != nil {
			return err
		}
		none, err = frees(tx, "k", report.Local{Policy: "default", Limit: 20, WindowS: 60}, now.Add(2*time.Minute))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := freeing{Policy: "default", Limit: 20, WindowS: 60, Used: 4,
		Next: stamp(ceilSecond(t0.Add(200*time.Millisecond + stay))), NextCalls: 2, All: stamp(t0.Add(30*time.Second + stay))}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("frees (-want +got):\n%s", diff)
	}
	if want := (freeing{Policy: "default", Limit: 20, WindowS: 60}); none != want {
		t.Errorf("frees once all have left = %+v, want %+v", none, want)
	}
}
