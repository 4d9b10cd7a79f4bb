package pacer

import (
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// The instants the rules are tested at.
var (
	u0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	u1 = u0.Add(10 * time.Second)
	u2 = u0.Add(20 * time.Second)
	u3 = u0.Add(30 * time.Second)
)

func unitsKey(policies ...keystore.Policy) *keystore.Key {
	return &keystore.Key{Name: "k", MaxRate: 1000, MaxConcurrency: 100, Policies: policies}
}

func budgetOf(t *testing.T, d decision, policy string) Budget {
	t.Helper()
	for _, b := range d.budgets {
		if b.Policy == policy {
			return b
		}
	}
	t.Fatalf("no budget of policy %q in %+v", policy, d.budgets)
	return Budget{}
}

// A policy in content-bytes is spent by the bytes each call carried, in
// its sliding window: a call goes when what is left holds its whole
// body, and otherwise waits until enough of the window's bytes leave it.
func TestContentBytesRule(t *testing.T) {
	k := unitsKey(keystore.Policy{Name: "bytes", Unit: ratelimit.ContentBytes, Quota: 1000, Window: time.Minute})
	log := fakeLog{{at: u0, bytes: 400}, {at: u1, bytes: 300}, {at: u2, bytes: 200}} // 900 of 1000 used at u3
	at := func(bytes int64) (decision, snapshot) {
		s := snapshot{now: u3, key: k, log: log, bytes: bytes}
		d, err := decide(s)
		if err != nil {
			t.Fatal(err)
		}
		return d, s
	}
	m := snapshot{now: u3, key: k}.margin(time.Minute)
	for _, tt := range []struct {
		bytes int64
		admit bool
		wait  time.Duration // when it waits: until these bytes leave the window
	}{
		{0, true, 0},
		{100, true, 0},
		{101, false, u0.Add(time.Minute + m).Sub(u3)}, // the first call's 400 must leave
		{500, false, u0.Add(time.Minute + m).Sub(u3)},
		{501, false, u1.Add(time.Minute + m).Sub(u3)}, // the first two must leave
		{1000, false, u2.Add(time.Minute + m).Sub(u3)},
	} {
		d, _ := at(tt.bytes)
		if d.admit != tt.admit || d.wait != tt.wait {
			t.Errorf("a call carrying %d bytes: admit %v, wait %v; want %v, %v (%s)", tt.bytes, d.admit, d.wait, tt.admit, tt.wait, d.reason)
		}
		want := reason.Reason{Kind: reason.BytesShort, Policy: "bytes", Left: 100, Limit: 1000, Window: time.Minute, Carries: tt.bytes}
		if !tt.admit && (d.source != "bytes" || d.reason != want) {
			t.Errorf("a call carrying %d bytes waits for %q: %+v; want the byte policy with what is left: %+v", tt.bytes, d.source, d.reason, want)
		}
		b := budgetOf(t, d, "bytes")
		if b.Unit != ratelimit.ContentBytes || b.Used != 900 || b.Remaining != 100 || b.Limit != 1000 {
			t.Errorf("the byte budget: got %+v, want 900 used and 100 of 1000 content-bytes left", b)
		}
	}

	// A body larger than the whole quota never fits: it is refused at
	// once, whatever the caller would wait.
	d, _ := at(1001)
	if want := (reason.Reason{Kind: reason.BytesNever, Policy: "bytes", Carries: 1001, Limit: 1000, Window: time.Minute}); d.admit || !d.never || d.reason != want {
		t.Errorf("a body of 1001 bytes under a quota of 1000: admit %v, never %v, %+v; want never, %+v", d.admit, d.never, d.reason, want)
	}

	// Calls are not bytes: a byte policy ignores how many calls went.
	many := fakeLog{}
	for i := range 50 {
		many = append(many, sent{at: u0.Add(time.Duration(i) * time.Millisecond), bytes: 1})
	}
	if d, _ := decide(snapshot{now: u3, key: k, log: many, bytes: 900}); !d.admit {
		t.Errorf("50 calls of 1 byte, then 900: waits %v (%s); want admitted", d.wait, d.reason)
	}
	// An exhausted byte budget holds back a call without a body too.
	full := fakeLog{{at: u2, bytes: 1000}}
	if d, _ := decide(snapshot{now: u3, key: k, log: full}); d.admit {
		t.Errorf("a call without a body on a spent byte budget: admitted; want it to wait")
	}
}

// An upstream's r in content-bytes is counted down by the bytes of every
// send since it was observed, and a call goes only when what is left holds
// its body.
func TestContentBytesObservation(t *testing.T) {
	k := unitsKey()
	kn := ledger.SeenPolicy{Key: "k", ReceivedAt: u1, BasisAt: u1, Observation: ratelimit.Observation{Policy: "upload",
		Unit: ratelimit.ContentBytes, Remaining: 500, HasRemaining: true, Reset: time.Minute, HasReset: true, Shape: ratelimit.ShapeDraft}}
	log := fakeLog{{at: u0, bytes: 10000}, {at: u2, bytes: 200}} // only the send after the observation counts
	for _, tt := range []struct {
		bytes int64
		admit bool
	}{{0, true}, {300, true}, {301, false}} {
		d, err := decide(snapshot{now: u3, key: k, seen: []ledger.SeenPolicy{kn}, log: log, bytes: tt.bytes})
		if err != nil {
			t.Fatal(err)
		}
		if d.admit != tt.admit {
			t.Errorf("a call carrying %d bytes, 300 left: admit %v (%s); want %v", tt.bytes, d.admit, d.reason, tt.admit)
		}
		if b := budgetOf(t, d, "upload"); b.Remaining != 300 {
			t.Errorf("the upstream's byte budget: %d left, want 500 less the 200 sent since", b.Remaining)
		}
		if !tt.admit {
			why := reason.Reason{Kind: reason.UpstreamShort, Policy: "upload", Unit: ratelimit.ContentBytes, Left: 300,
				For: u1.Add(time.Minute).Sub(u3), Carries: tt.bytes}
			if want := u1.Add(time.Minute).Sub(u3); d.wait != want || d.reason != why {
				t.Errorf("waits %v: %+v; want %v, saying what is left and what the request carries: %+v", d.wait, d.reason, want, why)
			}
		}
	}
}

// A policy in concurrent-requests counts the calls in flight, and frees
// a slot when one of them ends: its observation never expires into a
// probe, and nothing but a call ending lets the next one go.
func TestConcurrentRequestsRule(t *testing.T) {
	conc := func(q int64, hasQ bool, r int64) ledger.SeenPolicy {
		return ledger.SeenPolicy{Key: "k", ReceivedAt: u0, BasisAt: u0, Observation: ratelimit.Observation{Policy: "conc",
			Unit: ratelimit.ConcurrentRequests, Quota: q, HasQuota: hasQ, Remaining: r, HasRemaining: true,
			Reset: 5 * time.Second, HasReset: true, Shape: ratelimit.ShapeDraft}}
	}
	// full is the reason of a policy whose limit of concurrent requests
	// (0: as many as the last answer allows) is in flight.
	full := func(limit, inFlight int64) reason.Reason {
		return reason.Reason{Kind: reason.ConcurrencyFull, Policy: "conc", Limit: limit, InFlight: inFlight}
	}
	for _, tt := range []struct {
		name     string
		key      *keystore.Key
		seen     []ledger.SeenPolicy
		now      time.Time
		inFlight int
		admit    bool
		reason   reason.Reason
	}{
		{"q=2, 1 in flight", unitsKey(), []ledger.SeenPolicy{conc(2, true, 1)}, u0, 1, true, reason.Reason{}},
		{"q=2, 2 in flight", unitsKey(), []ledger.SeenPolicy{conc(2, true, 1)}, u0, 2, false, full(2, 2)},
		// Long after its t, the policy still counts the calls in flight,
		// and asks for no probe.
		{"q=2, 2 in flight, expired", unitsKey(), []ledger.SeenPolicy{conc(2, true, 1)}, u3, 2, false, full(2, 2)},
		{"q=2, none in flight, expired", unitsKey(), []ledger.SeenPolicy{conc(2, true, 0)}, u3, 0, true, reason.Reason{}},
		// A quota of 0 lets one call at a time go, whose answer may say more.
		{"q=0, none in flight", unitsKey(), []ledger.SeenPolicy{conc(0, true, 0)}, u1, 0, true, reason.Reason{}},
		{"q=0, 1 in flight", unitsKey(), []ledger.SeenPolicy{conc(0, true, 0)}, u1, 1, false, full(1, 1)},
		// Without q, r more could start while the answered call was in
		// flight: r+1 at once.
		{"r=0, 1 in flight", unitsKey(), []ledger.SeenPolicy{conc(0, false, 0)}, u3, 1, false, full(0, 1)},
		{"r=0, none in flight", unitsKey(), []ledger.SeenPolicy{conc(0, false, 0)}, u3, 0, true, reason.Reason{}},
		{"r=2, 2 in flight", unitsKey(), []ledger.SeenPolicy{conc(0, false, 2)}, u1, 2, true, reason.Reason{}},
		{"documented, 3 in flight", unitsKey(keystore.Policy{Name: "conc", Unit: ratelimit.ConcurrentRequests, Quota: 3}), nil, u0, 3, false, full(3, 3)},
		{"documented, 2 in flight", unitsKey(keystore.Policy{Name: "conc", Unit: ratelimit.ConcurrentRequests, Quota: 3}), nil, u0, 2, true, reason.Reason{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := snapshot{now: tt.now, key: tt.key, seen: tt.seen, log: fakeLog{},
				ks: ledger.KeyState{Key: "k", LastResponseAt: u0}, flight: ledger.Flight{Count: tt.inFlight, Oldest: u0}}
			d, err := decide(s)
			if err != nil {
				t.Fatal(err)
			}
			if d.admit != tt.admit || d.probe {
				t.Fatalf("admit %v, probe %v (%s: %s); want admit %v and no probe", d.admit, d.probe, d.source, d.reason, tt.admit)
			}
			if !tt.admit && (d.source != "conc" || !d.poll || d.reason != tt.reason) {
				t.Errorf("waits for %s (poll %v): %+v; want policy 'conc', until a call ends, because %+v", d.source, d.poll, d.reason, tt.reason)
			}
			if b := budgetOf(t, d, "conc"); b.Unit != ratelimit.ConcurrentRequests || b.Used != int64(tt.inFlight) || b.Expired {
				t.Errorf("the budget: %+v; want %d in flight, never expired", b, tt.inFlight)
			}
		})
	}
}

// The advice names the unit that binds.
func TestUnitAdvice(t *testing.T) {
	for _, tt := range []struct {
		b      Budget
		action Action
		want   reason.Reason
	}{
		{Budget{Policy: "bytes", Unit: ratelimit.ContentBytes, Limit: 1000000, Remaining: 120, Reset: 30 * time.Second, Window: time.Minute},
			Continue, reason.Reason{Kind: reason.BytesLeft, Policy: "bytes", Left: 120, Limit: 1000000, For: 30 * time.Second}},
		{Budget{Policy: "conc", Unit: ratelimit.ConcurrentRequests, Limit: 4, Used: 3, Remaining: 1},
			Continue, reason.Reason{Kind: reason.InFlightOf, Policy: "conc", Used: 3, Limit: 4, Left: 1}},
		{Budget{Policy: "conc", Unit: ratelimit.ConcurrentRequests, Limit: 4, Used: 4, Remaining: 0},
			SlowDown, reason.Reason{Kind: reason.InFlightOf, Policy: "conc", Used: 4, Limit: 4}},
		{Budget{Policy: "default", Unit: ratelimit.Requests, Limit: 10, Remaining: 3, Reset: 5 * time.Second},
			Continue, reason.Reason{Kind: reason.CallsLeft, Left: 3, For: 5 * time.Second}},
	} {
		b := tt.b
		a := adviceFor(decision{admit: true, binding: &b})
		if a.Action != tt.action || a.Why != tt.want {
			t.Errorf("advice on %s: %s %+v; want %s %+v", b.Unit, a.Action, a.Why, tt.action, tt.want)
		}
	}
}

// Evicted policies in content-bytes fold into a folded policy of their
// own, as tight as each of them: the least quota over the longest window,
// and the least of what their live words have left, the bytes sent since
// subtracted. They are never folded into the requests one.
func TestFoldContentBytes(t *testing.T) {
	now := b0.Add(10 * time.Second)
	bytesSince := map[time.Time]int64{b0: 700}
	count := func(since time.Time) (int64, error) { return bytesSince[since], nil }
	c, err := fold(ledger.SeenPolicy{}, kept("a", ratelimit.ContentBytes, 100000, time.Minute, 0, 0), now, count)
	if err == nil {
		c, err = fold(c, kept("b", ratelimit.ContentBytes, 5000000, time.Hour, 1000, time.Minute), now, count)
	}
	if err != nil {
		t.Fatal(err)
	}
	if c.Unit != ratelimit.ContentBytes || c.Quota != 100000 || c.Window != time.Hour || c.Remaining != 300 || !c.HasRemaining {
		t.Errorf("byte policies folded: %s q=%d w=%s r=%d; want content-bytes q=100000 w=1h r=300 (1000 less 700 sent)",
			c.Unit, c.Quota, c.Window, c.Remaining)
	}
	if r := restraintOf(kept("a", ratelimit.ContentBytes, 1000, time.Minute, 0, 0), now, now); r.class != 2 {
		t.Errorf("a byte quota over a window ranks %d; want 2, a policy that binds", r.class)
	}
}
