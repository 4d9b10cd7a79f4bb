package pacer_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// Two calls by B to a route that answers 503 without a rate-limit signal
// (with their retries, five failures) open that route's circuit, and A's
// call on another route still goes; failures across many routes are the
// key's, and open its circuit.
func TestFailingRouteBacksOffItsRouteAlone(t *testing.T) {
	e := newEnv(t)
	k := newKey()
	fail := func(caller, path string) pacer.Result {
		t.Helper()
		tk, err := e.admitWith(e.p, e.call(k, caller, path))
		if err != nil {
			t.Fatalf("%s: %s on %s: %v, want admitted", e.clk.Now().Sub(start), caller, path, err)
		}
		return e.answer(tk, http.StatusServiceUnavailable, &ratelimit.Reading{})
	}
	// Two calls, each with its retries: 3 + 2 attempts, each after its
	// backoff.
	var last pacer.Result
	for range 5 {
		last = fail("B", "/bad")
		e.clk.advance(last.RetryIn)
	}
	e.clk.advance(-last.RetryIn)
	if last.RetryIn < pacer.BreakerCooldown {
		t.Errorf("after 5 failures on /bad: retry in %s, want its circuit's cooldown", last.RetryIn)
	}
	if pe := e.mustPause(k, "B", "/bad"); pe.Source != "circuit" {
		t.Errorf("B on /bad after 5 failures: refused by %q, want its route's circuit", pe.Source)
	}
	e.clk.advance(time.Millisecond)
	e.mustAdmit(k, "A", "/good") // another route goes on
	st := e.status(k, "A")
	if st.Advice.Action != pacer.Continue {
		t.Errorf("the key's advice after one route failed: %s (%+v), want continue", st.Advice.Action, st.Advice.Why)
	}

	// An overloaded upstream fails on every route: once PathSpread routes
	// failed within PathWindow, each failure is the key's.
	e.clk.advance(time.Second)
	opened, sent := false, 0
	for i := 0; i < 40 && !opened; i++ {
		tk, err := e.admitWith(e.p, e.call(k, "A", fmt.Sprintf("/p%d", i)))
		if pe, ok := err.(*pacer.PauseError); ok {
			if opened = pe.Source == "circuit"; !opened {
				e.clk.advance(pe.RetryAfter) // the key's backoff
			}
			continue
		} else if err != nil {
			t.Fatal(err)
		}
		sent++
		e.answer(tk, http.StatusServiceUnavailable, &ratelimit.Reading{})
		e.clk.advance(time.Millisecond)
	}
	if !opened {
		t.Fatalf("failures on %d routes did not open the key's circuit", sent)
	}
	if sent < pacer.PathSpread {
		t.Errorf("the key's circuit opened after failures on %d routes, want at least %d", sent, pacer.PathSpread)
	}
	if pe := e.mustPause(k, "A", "/never-called"); pe.Source != "circuit" {
		t.Errorf("a route never called, with the key's circuit open: refused by %q, want circuit", pe.Source)
	}
}
