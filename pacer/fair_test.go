package pacer_test

import (
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// A principal's share caps what it spends of the key per window, counted
// over every process sharing the state; the others still have the rest,
// and the refusal and the status say it is the principal's share, not
// the key, that is spent.
func TestShareCapsAPrincipalAcrossProcesses(t *testing.T) {
	e := newEnv(t)
	_, other := e.open()
	k := newKey(policy("default", 4, time.Minute))
	k.Shares = []keystore.Share{{Principal: "nightly-sync", Share: 0.5}}

	e.mustAdmit(k, "nightly-sync", "/a")
	e.clk.advance(time.Second)
	if _, err := e.admitWith(other, e.call(k, "nightly-sync", "/b")); err != nil {
		t.Fatalf("second process: got %v, want admitted", err)
	}
	e.clk.advance(time.Second)
	pe := e.mustPause(k, "nightly-sync", "/c")
	if pe.Source != pacer.SourceShare {
		t.Errorf("got source %q, want %q", pe.Source, pacer.SourceShare)
	}
	// Its first call leaves the window 60 s after it went (with the
	// margin, up to a second more): 58 s from now.
	if pe.RetryAfter < 58*time.Second || pe.RetryAfter > 59*time.Second {
		t.Errorf("got retry after %v, want when its oldest call leaves the window (58 s, and the margin)", pe.RetryAfter)
	}
	if r := pe.Reason; r.Kind != reason.ShareSpent || r.Principal != "nightly-sync" || r.Left != 2 {
		t.Errorf("got reason %+v, want the principal's share spent, and 2 left for the others", pe.Reason)
	}
	st := e.status(k, "nightly-sync")
	if st.Advice.Action != pacer.Pause || st.Advice.Why.Kind != reason.ShareSpent || st.Advice.Why.Principal != "nightly-sync" {
		t.Errorf("status for nightly-sync: got %s %+v, want a pause for its share", st.Advice.Action, st.Advice.Why)
	}
	if st := e.status(k, "agent"); st.Advice.Action != pacer.Continue {
		t.Errorf("status for agent: got %s %+v, want continue", st.Advice.Action, st.Advice.Why)
	}
	// A person through a client is the same principal through another.
	k.Shares = append(k.Shares, keystore.Share{Principal: "alice@example.com", Share: 0.25})
	e.mustAdmit(k, "alice@example.com via Claude.ai", "/d")
	if pe := mustPause(t, e.clk, other, e.call(k, "alice@example.com via VS Code", "/e")); pe.Source != pacer.SourceShare {
		t.Errorf("alice through another client: got source %q, want her share spent", pe.Source)
	}
	e.clk.advance(time.Millisecond)
	e.mustAdmit(k, "agent", "/f")

}

// Principals waiting for a key take turns across processes: one whose
// call was refused while the window was full keeps its place, and once
// the window frees, another principal asking over and over gets no more
// than its part before the one that waited has had its turn.
func TestWaitingPrincipalsTakeTurns(t *testing.T) {
	e := newEnv(t)
	_, other := e.open()
	k := newKey(policy("default", 4, time.Minute))
	k.Shares = []keystore.Share{{Principal: keystore.AnyPrincipal, Share: 1}}

	for range 4 {
		e.mustAdmit(k, "nightly-sync", "/sync")
		e.clk.advance(time.Millisecond)
	}
	e.clk.advance(time.Second)
	pe := mustPause(t, e.clk, other, e.call(k, "alice", "/a")) // the key is spent: alice waits for it
	if pe.Source != "default" {
		t.Fatalf("alice: got source %q, want the key's policy", pe.Source)
	}
	e.clk.advance(pe.RetryAfter + 10*time.Millisecond) // every call of the window has left it
	// After the key's pause, calls resume 2 s apart, the spacing halving
	// with each admission (slow start).
	e.mustAdmit(k, "nightly-sync", "/sync")
	e.clk.advance(time.Second)
	e.mustAdmit(k, "nightly-sync", "/sync") // its half of the window
	e.clk.advance(500 * time.Millisecond)
	pe = e.mustPause(k, "nightly-sync", "/sync")
	if r := pe.Reason; pe.Source != pacer.SourceTurn || r.Kind != reason.Turn || r.Other != "alice" || r.Behind != 0 {
		t.Fatalf("sync's third: got %s %+v, want it to wait for alice's turn (0 of this window's calls)", pe.Source, pe.Reason)
	}
	e.clk.advance(500 * time.Millisecond)
	if _, err := e.admitWith(other, e.call(k, "alice", "/a")); err != nil {
		t.Fatalf("alice: got %v, want admitted in her turn", err)
	}
	// Alice admitted keeps her place for a second, should she call
	// again at once; then she waits no longer, and the window's last call
	// is anyone's.
	e.clk.advance(500 * time.Millisecond)
	if pe := e.mustPause(k, "nightly-sync", "/sync"); pe.Source != pacer.SourceTurn {
		t.Fatalf("sync, just after alice's call: got %s %q, want it to wait for her turn", pe.Source, pe.Reason)
	}
	e.clk.advance(time.Second)
	e.mustAdmit(k, "nightly-sync", "/sync")
}
