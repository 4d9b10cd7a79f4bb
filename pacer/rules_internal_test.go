package pacer

import (
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// A gate on the whole key pauses the key; a gate on this call's route
// holds it back without pausing the key; another route's gate does not
// bind it; a gate already past is dropped when the constraints are kept.
func TestDecideGateRule(t *testing.T) {
	s := snapshot{now: u1, route: "GET /a", gates: []ledger.Gate{
		{Until: u2, Reason: reason.Reason{Kind: reason.Said, Said: "key"}, Source: "retry-after"},
		{Scope: routePartition("GET /a"), Until: u3, Reason: reason.Reason{Kind: reason.Said, Said: "own route"}, Source: "backoff"},
		{Scope: routePartition("GET /b"), Until: u3, Reason: reason.Reason{Kind: reason.Said, Said: "other route"}, Source: "backoff"},
		{Until: u0, Reason: reason.Reason{Kind: reason.Said, Said: "past"}, Source: "circuit"},
	}}
	var cs constraints
	cs.add(s.gateRule()...)
	want := []constraint{
		{wait: u2.Sub(u1), reason: reason.Reason{Kind: reason.Said, Source: "retry-after", Said: "key"}, source: "retry-after", gate: ledger.RetryAfterGate, exhaust: true, keyWide: true},
		{wait: u3.Sub(u1), reason: reason.Reason{Kind: reason.Said, Source: "backoff", Said: "own route"}, source: "backoff", gate: ledger.BackoffGate, exhaust: true},
	}
	if len(cs) != len(want) {
		t.Fatalf("gates at u1: %+v; want %+v", cs, want)
	}
	for i := range want {
		if cs[i] != want[i] {
			t.Errorf("gate %d: %+v; want %+v", i, cs[i], want[i])
		}
	}
}

// The local safety limits: a full set of calls in flight polls (unless the
// decision is for a status), and calls are spaced by the key's maximum
// rate or the slow start's interval, whichever is wider.
func TestDecideSafetyRule(t *testing.T) {
	k := &keystore.Key{Name: "k", MaxRate: 10, MaxConcurrency: 2} // 100 ms apart
	for _, tt := range []struct {
		name     string
		flight   int
		noWait   bool
		last     time.Time
		interval time.Duration
		want     []string      // the sources, in order
		pace     time.Duration // the pace's wait, when it binds
	}{
		{"fresh key", 0, false, time.Time{}, 0, nil, 0},
		{"in flight at the limit", 2, false, time.Time{}, 0, []string{"concurrency"}, 0},
		{"in flight at the limit, for a status", 2, true, time.Time{}, 0, nil, 0},
		{"admitted 40 ms ago", 0, false, u1.Add(-40 * time.Millisecond), 0, []string{"pace"}, 60 * time.Millisecond},
		{"slow start wider than the rate", 1, false, u1.Add(-40 * time.Millisecond), time.Second, []string{"pace"}, 960 * time.Millisecond},
		{"admitted long ago", 0, false, u0, 0, nil, 0},
	} {
		s := snapshot{now: u1, key: k, flight: ledger.Flight{Count: tt.flight}, noFlightWait: tt.noWait,
			ks: ledger.KeyState{LastAdmitAt: tt.last, Interval: tt.interval}}
		var cs constraints
		cs.add(s.safetyRule()...)
		var got []string
		for _, c := range cs {
			got = append(got, c.source)
			if c.source == "pace" && c.wait != tt.pace {
				t.Errorf("%s: the pace waits %v; want %v", tt.name, c.wait, tt.pace)
			}
			if c.source == "concurrency" && (!c.poll || c.wait != Poll) {
				t.Errorf("%s: the concurrency limit %+v; want a poll", tt.name, c)
			}
		}
		if strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Errorf("%s: constraints %v; want %v", tt.name, got, tt.want)
		}
	}
}

// The constraint that binds: one that can never be met, else the longest
// wait, a wait for quota before spacing of the same length, and the first
// found among equals.
func TestDecideWorstConstraint(t *testing.T) {
	for _, tt := range []struct {
		name string
		cs   []constraint
		want string
	}{
		{"longest", []constraint{{wait: time.Second, source: "a"}, {wait: 2 * time.Second, source: "b"}}, "b"},
		{"quota before spacing", []constraint{{wait: time.Second, source: "pace"}, {wait: time.Second, source: "q", exhaust: true}}, "q"},
		{"first among equals", []constraint{{wait: time.Second, source: "a", exhaust: true}, {wait: time.Second, source: "b", exhaust: true}}, "a"},
		{"never", []constraint{{wait: time.Hour, source: "a"}, {wait: time.Second, source: "n", never: true}, {wait: 2 * time.Hour, source: "c"}}, "n"},
	} {
		if got := constraints(tt.cs).worst(); got.source != tt.want {
			t.Errorf("%s: %q binds; want %q", tt.name, got.source, tt.want)
		}
	}
	var cs constraints
	cs.add(constraint{wait: time.Microsecond - 1, source: "rounding"}, constraint{wait: time.Microsecond, source: "kept"})
	if len(cs) != 1 || cs[0].source != "kept" {
		t.Errorf("constraints under a microsecond: kept %+v; want only the one of a microsecond", cs)
	}
}

// What a refusal nothing explained reveals, at fixed instants: a limit
// inferred from the sends accepted before it; the latest limit stretched
// when it refused again before anything got through (or renewed, when it
// has no quota); else a wait of the refusal's Retry-After with no quota.
func TestInferHiddenRule(t *testing.T) {
	sends := []time.Time{u0, u0.Add(time.Second), u0.Add(2 * time.Second)}
	latest := &ledger.SeenPolicy{BasisAt: u0, Hidden: true, Observation: ratelimit.Observation{Policy: "hidden",
		Quota: 3, HasQuota: true, Window: time.Minute}}
	long := &ledger.SeenPolicy{BasisAt: u0, Hidden: true, Observation: ratelimit.Observation{Policy: "hidden",
		Quota: 3, HasQuota: true, Window: 20 * time.Hour}}
	noQuota := &ledger.SeenPolicy{BasisAt: u0, Hidden: true, Observation: ratelimit.Observation{Policy: "hidden", Window: time.Minute}}
	ra := func(d time.Duration) *ratelimit.Reading {
		return &ratelimit.Reading{RetryAfter: d, HasRetryAfter: true}
	}
	at := u0.Add(70 * time.Second)
	for _, tt := range []struct {
		name   string
		given  string
		latest *ledger.SeenPolicy
		sends  []time.Time
		rd     *ratelimit.Reading
		now    time.Time
		want   hiddenInference
	}{
		{"three sends then a refusal to wait 57 s", "", nil, sends, ra(57 * time.Second), u0.Add(3 * time.Second),
			hiddenInference{name: "hidden", lim: limit{quota: 3, window: time.Minute, start: u0}, inferred: true}},
		{"the refusal names the limit", "per-minute", nil, sends, ra(57 * time.Second), u0.Add(3 * time.Second),
			hiddenInference{name: "per-minute", lim: limit{quota: 3, window: time.Minute, start: u0}, inferred: true}},
		{"refused again, to wait 30 s", "", latest, nil, ra(30 * time.Second), at,
			hiddenInference{name: "hidden", lim: limit{quota: 3, window: 100 * time.Second, start: u0}, stretched: true}},
		{"refused again, no Retry-After", "", latest, nil, &ratelimit.Reading{}, at,
			hiddenInference{name: "hidden", lim: limit{quota: 3, window: 2 * time.Minute, start: u0}, stretched: true}},
		{"refused again, stretched past the bound", "", long, nil, &ratelimit.Reading{}, at,
			hiddenInference{name: "hidden", lim: limit{quota: 3, window: MaxHiddenWindow, start: u0}, stretched: true}},
		{"refused again, no quota to stretch", "", noQuota, nil, &ratelimit.Reading{}, at,
			hiddenInference{name: "hidden", renew: true}},
		{"another limit named, nothing sent", "per-day", latest, nil, ra(10 * time.Second), at,
			hiddenInference{name: "per-day", lim: limit{window: DefaultHiddenWindow, start: at}}},
		{"first refusal, nothing sent", "", nil, nil, ra(5 * time.Minute), at,
			hiddenInference{name: "hidden", lim: limit{window: 5 * time.Minute, start: at}}},
	} {
		var hidden []ledger.SeenPolicy
		if tt.latest != nil {
			hidden = []ledger.SeenPolicy{*tt.latest}
		}
		if got := inferHidden(tt.given, hidden, tt.latest, tt.sends, tt.rd, tt.now); got != tt.want {
			t.Errorf("%s: %+v; want %+v", tt.name, got, tt.want)
		}
	}
}

// A refusal names a new limit when it names a policy that neither the
// upstream nor the key's configuration announced; naming only announced
// ones, it is explained (the count of them was behind).
func TestInferHiddenName(t *testing.T) {
	known := []ledger.SeenPolicy{
		{Observation: ratelimit.Observation{Policy: "announced"}},
		{Hidden: true, Observation: ratelimit.Observation{Policy: "hidden"}},
	}
	policies := []keystore.Policy{{Name: "documented"}}
	for _, tt := range []struct {
		violated  []string
		want      string
		explained bool
	}{
		{nil, "", false},
		{[]string{"announced", "documented"}, "", true},
		{[]string{"announced", "new", "other"}, "new", false},
		{[]string{"hidden"}, "hidden", false}, // inferred, never announced
	} {
		rd := &ratelimit.Reading{}
		if tt.violated != nil {
			rd.Problem = &ratelimit.Problem{ViolatedPolicies: tt.violated}
		}
		name, explained := unannouncedName(rd, known, policies)
		if name != tt.want || explained != tt.explained {
			t.Errorf("violated %v: %q, explained %v; want %q, %v", tt.violated, name, explained, tt.want, tt.explained)
		}
	}

	// A hidden limit discovered at or after the call's admission means
	// the refusal belongs to that discovery.
	ks := []ledger.SeenPolicy{{Hidden: true, ReceivedAt: u0}, {Hidden: true, ReceivedAt: u1}, {ReceivedAt: u3}}
	if hidden, latest, during := hiddenSoFar(ks, u2); during || len(hidden) != 2 || latest == nil || !latest.ReceivedAt.Equal(u1) {
		t.Errorf("admitted at u2: hidden %d, latest %+v, during %v; want 2, the one of u1, false", len(hidden), latest, during)
	}
	if _, _, during := hiddenSoFar(ks, u1); !during {
		t.Errorf("admitted at u1, a discovery at u1: not during; want during")
	}
}

// An observation past its effective window asks for one probe, after a
// jitter every process computes alike; an answer since then asks for
// nothing.
func TestDecideExpiredRule(t *testing.T) {
	k := ledger.SeenPolicy{ReceivedAt: u0, Observation: ratelimit.Observation{Policy: "p", Remaining: 0, HasRemaining: true,
		Window: time.Minute}}
	end := u1
	at := end.Add(jitter("k\x00p\x00", end, probeJitter(k)))
	if !at.After(end) {
		t.Fatalf("the jitter at these instants is zero: choose others")
	}
	for _, tt := range []struct {
		name     string
		now      time.Time
		answered time.Time
		wait     time.Duration
		probe    bool
	}{
		{"answered since", at, u2, 0, false},
		{"within the jitter", end, time.Time{}, at.Sub(end), false},
		{"after the jitter", at, time.Time{}, 0, true},
	} {
		s := snapshot{now: tt.now, key: &keystore.Key{Name: "k"}, ks: ledger.KeyState{LastResponseAt: tt.answered}}
		c, probe := s.expiredRule(k, end)
		if c.wait != tt.wait || probe != tt.probe {
			t.Errorf("%s: wait %v, probe %v; want %v, %v", tt.name, c.wait, probe, tt.wait, tt.probe)
		}
		if tt.wait > 0 && (!c.exhaust || !c.keyWide || c.source != "p") {
			t.Errorf("%s: %+v; want a key-wide wait for policy p, with nothing left", tt.name, c)
		}
	}
}
