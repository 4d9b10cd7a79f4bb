package pacer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// A send that would leave later after its admission than its margin
// allows is not sent: Leaving says so, its attempt ends counted where it
// was admitted, and the call is admitted again, in the window it will
// land in — its own admission not counting the attempt it replaces, every
// other one counting both. The delay is measured: the next admission
// allows for it.
func TestLateSendIsAdmittedAgain(t *testing.T) {
	e := newEnv(t)
	k := newKey(policy("p", 2, 4*time.Second)) // allowance: 200 ms before any send is measured
	ms := time.Millisecond

	on := e.mustAdmit(k, "sync", "/items")
	e.clk.advance(150 * ms)
	if err := e.p.Leaving(on); err != nil {
		t.Fatalf("a send 150 ms after its admission: Leaving says %v, want nil", err)
	}
	e.answer(on, 200, nil)

	c := e.call(k, "sync", "/items")
	late, err := e.admitWith(e.p, c)
	if err != nil {
		t.Fatal(err)
	}
	e.clk.advance(600 * ms)
	err = e.p.Leaving(late)
	var le *pacer.LateError
	if !errors.As(err, &le) {
		t.Fatalf("a send 600 ms after its admission: Leaving says %v, want a *LateError", err)
	}
	if le.Delay != 600*ms || le.Allowed < 150*ms || le.Allowed > 200*ms {
		t.Errorf("got %+v; want a delay of 600ms and an allowance of 150 to 200 ms", le)
	}
	if _, err := e.p.Done(context.Background(), late, pacer.Outcome{Err: le, CallerAbort: true}); err != nil {
		t.Fatal(err)
	}
	c.Attempt++
	c.Late = le
	again, err := e.admitWith(e.p, c)
	if err != nil {
		t.Fatalf("admitted again: %v", err)
	}
	if !again.AdmittedAt.Equal(e.clk.Now()) {
		t.Errorf("admitted again at %v, want now (%v)", again.AdmittedAt.Sub(start), e.clk.Now().Sub(start))
	}
	// The delays measured so far are 150 and 600 ms: the allowance follows
	// them, up to w/8 less the 150 ms latency margin kept for the send's
	// way to the upstream, so a send 350 ms after its admission is on time
	// now, and one 351 ms after would not be.
	e.clk.advance(350 * ms)
	if err := e.p.Leaving(again); err != nil {
		t.Errorf("a send 350 ms after its admission, once 600 ms were measured: Leaving says %v, want nil", err)
	}
	e.answer(again, 200, nil)

	// The late attempt stays counted where it was admitted, its call
	// again where it went: the window is full.
	pe := e.mustPause(k, "sync", "/items")
	if pe.Source != "p" {
		t.Errorf("paused by %q, want the policy p", pe.Source)
	}
	var states []string
	for _, a := range e.activity() {
		states = append(states, string(a.State))
		if a.ID == late.ID && (a.State != ledger.Failed || a.Reason.Kind != reason.Late || !a.SentAt.IsZero()) {
			t.Errorf("the late attempt is recorded as %s (%q, sent at %v); want failed, not sent", a.State, a.Reason, a.SentAt)
		}
	}
	if want := []string{string(ledger.Confirmed), string(ledger.Failed), string(ledger.Confirmed), string(ledger.RejectedLocal)}; strings.Join(states, " ") != strings.Join(want, " ") {
		t.Errorf("the activity holds %v, want %v", states, want)
	}
}

// A ticket from a lease is never late: the lease lasts a fraction of the
// margin, and its slots were counted at its grant.
func TestLeasedSendIsNeverLate(t *testing.T) {
	e := newEnv(t)
	k := newKey(policy("p", 100000, time.Hour))
	var leased *pacer.Ticket
	for range 40 {
		tk := e.mustAdmit(k, "sync", "/items")
		if tk.Leased() {
			leased = &tk
			break
		}
		e.answer(tk, 200, nil)
		e.clk.advance(time.Millisecond)
	}
	if leased == nil {
		t.Fatal("no call was admitted from a lease")
	}
	e.clk.advance(time.Minute)
	if err := e.p.Leaving(*leased); err != nil {
		t.Errorf("a leased send: Leaving says %v, want nil", err)
	}
}
