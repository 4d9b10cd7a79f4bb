package dashboard

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
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

func TestOutcomeCoversEveryState(t *testing.T) {
	for st, want := range map[string]string{ledger.Confirmed: "sent", ledger.Accepted: "sent", ledger.RejectedUpstream: "refused_upstream",
		ledger.RejectedLocal: "refused_locally", ledger.Cached: "kept_copy", ledger.Interrupted: "interrupted", ledger.Released: "interrupted",
		ledger.Failed: "failed", ledger.Admitted: "in_flight"} {
		if got := outcome(st); got != want {
			t.Errorf("outcome(%s) = %s, want %s", st, got, want)
		}
	}
}
