package pacer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// carrying is a call of k by caller whose request carries n bytes.
func (e *env) carrying(k *keystore.Key, caller string, n int64) pacer.Call {
	c := e.call(k, caller, "/upload")
	c.Method, c.Bytes = "POST", n
	return c
}

// A policy the upstream announces in content-bytes is spent by the bytes
// the requests carry, by every caller and process sharing the state: a
// call waits until the window holds its body, and the status and advice
// say so in bytes.
func TestContentBytesAreSpentByBodies(t *testing.T) {
	e := newEnv(t)
	_, other := e.open()
	k := newKey()
	bytesPolicy := ratelimit.Observation{Policy: "upload", Unit: ratelimit.ContentBytes, Quota: 1000, HasQuota: true,
		Window: time.Minute, Shape: ratelimit.ShapeDraft}
	e.send(k, "agent", 200, reading(0, bytesPolicy)) // a GET: no body

	admit := func(p *pacer.Pacer, caller string, n int64) {
		t.Helper()
		e.clk.advance(time.Second)
		if _, err := e.admitWith(p, e.carrying(k, caller, n)); err != nil {
			t.Fatalf("a call carrying %d bytes: %v; want admitted", n, err)
		}
	}
	admit(e.p, "agent", 400)
	admit(other, "sync", 300)
	admit(e.p, "sync", 200)

	e.clk.advance(time.Second)
	pe := mustPause(t, e.clk, e.p, e.carrying(k, "agent", 101))
	if r := pe.Reason; pe.Source != "upload" || r.Kind != reason.BytesShort || r.Policy != "upload" || r.Left != 100 || r.Limit != 1000 || r.Carries != 101 {
		t.Errorf("101 bytes with 100 left: paused by %s: %+v; want the byte policy, with what is left", pe.Source, pe.Reason)
	}
	// It waits for the first body to leave the window (sent 3 s ago), and
	// the margin a send stays in it longer (at most a second).
	if pe.RetryAfter <= 57*time.Second || pe.RetryAfter > 58*time.Second {
		t.Errorf("101 bytes: retry after %v; want the 400 bytes sent 3 s ago to leave the 60 s window", pe.RetryAfter)
	}
	st := e.status(k, "agent")
	b := upstreamBudget(t, st, "upload")
	if b.Unit != ratelimit.ContentBytes || b.Remaining != 100 || b.Used != 900 {
		t.Errorf("status of the byte policy: %+v; want 900 used, 100 left", b)
	}
	if r := st.Advice.Why; st.Binding == nil || st.Binding.Policy != "upload" || r.Kind != reason.BytesLeft || r.Left != 100 || r.Limit != 1000 {
		t.Errorf("status advice: %+v (binding %+v); want it to name what is left in content-bytes", st.Advice.Why, st.Binding)
	}
	admit(other, "agent", 100) // exactly what is left

	// A body larger than the whole quota is refused at once, however long
	// the caller would wait.
	c := e.carrying(k, "agent", 1001)
	c.MaxWait = time.Hour
	_, err := e.p.Admit(context.Background(), c)
	if !errors.As(err, &pe) || pe.Reason.Kind != reason.BytesNever {
		t.Errorf("a body larger than the quota: %v; want a pause saying it can never go", err)
	}
}

// A policy in concurrent-requests holds a call while its quota of calls
// is in flight, and lets it go when one of them ends — not when its
// observation's time runs out.
func TestConcurrencyIsReleasedWhenCallsEnd(t *testing.T) {
	e := newEnv(t)
	k := newKey()
	conc := ratelimit.Observation{Policy: "conc", Unit: ratelimit.ConcurrentRequests, Quota: 2, HasQuota: true,
		Remaining: 1, HasRemaining: true, Reset: 5 * time.Second, HasReset: true, Shape: ratelimit.ShapeDraft}
	e.send(k, "agent", 200, reading(0, conc))

	e.clk.advance(time.Second)
	a := e.mustAdmit(k, "agent", "/a")
	st := e.status(k, "agent")
	if b := upstreamBudget(t, st, "conc"); b.Used != 1 || b.Remaining != 1 || b.Expired {
		t.Errorf("status with 1 in flight: %+v; want 1 of 2 in flight, not expired", b)
	}
	e.clk.advance(time.Millisecond)
	e.mustAdmit(k, "sync", "/b")
	e.clk.advance(time.Millisecond)
	pe := e.mustPause(k, "agent", "/c")
	if r := pe.Reason; pe.Source != "conc" || r.Kind != reason.ConcurrencyFull || r.Limit != 2 || r.InFlight != 2 {
		t.Errorf("a third call: paused by %s: %+v; want the concurrency policy", pe.Source, pe.Reason)
	}
	st = e.status(k, "agent")
	if r := st.Advice.Why; r.Kind != reason.InFlightOf || r.Used != 2 || r.Limit != 2 || r.Policy != "conc" {
		t.Errorf("status advice with 2 in flight: %+v; want it to say so", st.Advice.Why)
	}

	// Long past its t, with no answer since, nothing changes: no probe,
	// no slot freed by the clock.
	e.clk.advance(time.Minute)
	e.mustPause(k, "agent", "/c")
	e.answer(a, 200, nil)
	e.clk.advance(time.Millisecond)
	tk := e.mustAdmit(k, "agent", "/c")
	if tk.Probe {
		t.Errorf("the call after one ended went as a probe; want an ordinary call")
	}
}

// The advice after a call says what is left of a byte budget for the
// next call, whatever that one carries: not what this call's body would
// find.
func TestAdviceAfterABodySaysWhatIsLeft(t *testing.T) {
	e := newEnv(t)
	k := newKey(keystore.Policy{Name: "upload", Unit: ratelimit.ContentBytes, Quota: 1000, Window: time.Minute})
	tk, err := e.admitWith(e.p, e.carrying(k, "sync", 600))
	if err != nil {
		t.Fatal(err)
	}
	res := e.answer(tk, 200, nil)
	if r := res.Advice.Why; res.Advice.Action != pacer.Continue || r.Kind != reason.BytesLeft || r.Left != 400 || r.Limit != 1000 || r.Policy != "upload" {
		t.Errorf("advice after 600 of 1000 bytes: %s %+v; want continue, with 400 content-bytes left", res.Advice.Action, res.Advice.Why)
	}
}
