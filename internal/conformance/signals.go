package conformance

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// signals: what the upstream said of a key, and what the pacer made of it.
var signals = []behaviour{
	{"a policy keeps what a new observation does not state, a hidden limit is replaced whole, a forgotten one is gone", known},
	{"a gate is never shortened, and opens at its time", gates},
	{"a route's failures read back as recorded, are counted by route, and are forgotten with their gates", pathFailures},
	{"a claim is never shortened, and ends at its time", claims},
	{"a key's pacing state reads back as recorded, a key never used as the zero state", keyState},
	{"the keys are those with a pacing state or a policy", keys},
	{"a key is warned of a kind by a warning of that kind after the time asked about", warned},
}

// Warned: a warning of the kind, of the key, raised after since; not one
// of another kind or key, nor one raised at since or before.
func warned(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	update(t, s, func(tx ledger.Tx) error {
		said := reason.Reason{Kind: reason.Said, Said: "w"}
		return errors.Join(
			tx.AddWarning(ledger.Warning{Key: "k", At: t0, Kind: ledger.WindowEdgeWarning, Reason: said}),
			tx.AddWarning(ledger.Warning{Key: "k", At: t0.Add(time.Minute), Kind: ledger.CircuitOpenWarning, Reason: said}),
			tx.AddWarning(ledger.Warning{Key: "other", At: t0.Add(time.Minute), Kind: ledger.WindowEdgeWarning, Reason: said}))
	}, "k", "other")
	for _, c := range []struct {
		key   string
		kind  ledger.WarningKind
		since time.Time
		want  bool
	}{
		{"k", ledger.WindowEdgeWarning, t0.Add(-time.Second), true},
		{"k", ledger.WindowEdgeWarning, t0, false}, // raised at since, not after
		{"k", ledger.CircuitOpenWarning, t0, true},
		{"k", ledger.HiddenLimitWarning, t0.Add(-time.Hour), false},
		{"none", ledger.WindowEdgeWarning, t0.Add(-time.Hour), false},
	} {
		update(t, s, func(tx ledger.Tx) error {
			got, err := tx.Warned(c.key, c.kind, c.since)
			if got != c.want {
				t.Errorf("Warned(%s, %s, t0%+v): %v, want %v", c.key, c.kind, c.since.Sub(t0), got, c.want)
			}
			return err
		}, c.key)
	}
}

// A policy's latest state: fields a new observation does not state keep
// their value; a hidden limit is replaced whole.
func known(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	obs := func(q, r int64, hasR bool) ratelimit.Observation {
		return ratelimit.Observation{Policy: "p", Unit: ratelimit.Requests, Quota: q, HasQuota: q > 0, Window: time.Minute,
			Remaining: r, HasRemaining: hasR, Reset: 30 * time.Second, HasReset: hasR, Shape: ratelimit.ShapeDraft}
	}
	put := func(k ledger.SeenPolicy) {
		update(t, s, func(tx ledger.Tx) error { return tx.PutSeenPolicy(k) }, k.Key)
	}
	get := func(key string) []ledger.SeenPolicy {
		var ks []ledger.SeenPolicy
		view(t, s, func(tx ledger.ReadTx) error {
			var err error
			ks, err = tx.SeenPolicies(key)
			return err
		})
		return ks
	}
	put(ledger.SeenPolicy{Key: "k", Observation: obs(100, 40, true), ReceivedAt: t0, BasisAt: t0, Route: "GET /a"})
	// Listed only (q and w): r, t and their times stay.
	put(ledger.SeenPolicy{Key: "k", Observation: obs(100, 0, false), ReceivedAt: t0.Add(time.Second), BasisAt: t0.Add(time.Second), Route: "GET /b"})
	want := ledger.SeenPolicy{Key: "k", Observation: obs(100, 40, true), ReceivedAt: t0, BasisAt: t0, Route: "GET /a"}
	if diff := cmp.Diff(get("k"), []ledger.SeenPolicy{want}); diff != "" {
		t.Errorf("after a listing (-got +want):\n%s", diff)
	}
	// Shown without q: q stays.
	put(ledger.SeenPolicy{Key: "k", Observation: obs(0, 10, true), ReceivedAt: t0.Add(2 * time.Second), BasisAt: t0.Add(2 * time.Second), Route: "GET /c"})
	want = ledger.SeenPolicy{Key: "k", Observation: obs(100, 10, true), ReceivedAt: t0.Add(2 * time.Second), BasisAt: t0.Add(2 * time.Second), Route: "GET /c"}
	if diff := cmp.Diff(get("k"), []ledger.SeenPolicy{want}); diff != "" {
		t.Errorf("after an r without q (-got +want):\n%s", diff)
	}
	// Another partition of the policy is a policy of its own, listed in
	// order.
	other := ledger.SeenPolicy{Key: "k", Observation: obs(5, 1, true), ReceivedAt: t0, BasisAt: t0}
	other.Partition = "user-1"
	put(other)
	if diff := cmp.Diff(get("k"), []ledger.SeenPolicy{want, other}); diff != "" {
		t.Errorf("with a second partition (-got +want):\n%s", diff)
	}

	hidden := func(q int64, w time.Duration, at time.Time) ledger.SeenPolicy {
		return ledger.SeenPolicy{Key: "h", Hidden: true, ReceivedAt: at, BasisAt: at.Add(-w), Route: "GET /x",
			Observation: ratelimit.Observation{Policy: "hidden", Unit: ratelimit.Requests, Quota: q, HasQuota: true, Window: w, Shape: ratelimit.ShapeInferred}}
	}
	put(hidden(10, time.Minute, t0))
	put(hidden(8, time.Hour, t0.Add(time.Hour)))
	if diff := cmp.Diff(get("h"), []ledger.SeenPolicy{hidden(8, time.Hour, t0.Add(time.Hour))}); diff != "" {
		t.Errorf("a hidden limit inferred again (-got +want):\n%s", diff)
	}
	if ks := get("never"); len(ks) != 0 {
		t.Errorf("SeenPolicies of a key never seen: %+v, want none", ks)
	}

	// A policy forgotten is gone, its other partitions and keys stay.
	update(t, s, func(tx ledger.Tx) error {
		if err := tx.DeleteSeenPolicy("k", "p", ratelimit.Requests, ""); err != nil {
			return err
		}
		return tx.DeleteSeenPolicy("k", "p", ratelimit.Tokens, "user-1") // another unit: kept
	}, "k")
	if diff := cmp.Diff(get("k"), []ledger.SeenPolicy{other}); diff != "" {
		t.Errorf("after forgetting one partition (-got +want):\n%s", diff)
	}
	if got := get("h"); len(got) != 1 {
		t.Errorf("another key's policies after a forget: %d, want 1", len(got))
	}
}

func gates(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	put := func(scope string, until time.Time, source ledger.GateSource) {
		update(t, s, func(tx ledger.Tx) error {
			return tx.PutGate(ledger.Gate{Key: "k", Scope: scope, Until: until, Source: source, Reason: reason.Reason{Kind: reason.Said, Said: string(source)}, SetAt: t0})
		}, "k")
	}
	read := func(now time.Time) []ledger.Gate {
		var gs []ledger.Gate
		view(t, s, func(tx ledger.ReadTx) error {
			var err error
			gs, err = tx.Gates("k", now)
			return err
		})
		return gs
	}
	put("", t0.Add(time.Minute), "retry-after")
	put("", t0.Add(time.Second), "backoff") // shorter: ignored
	want := []ledger.Gate{{Key: "k", Until: t0.Add(time.Minute), Reason: reason.Reason{Kind: reason.Said, Said: "retry-after"}, Source: "retry-after", SetAt: t0}}
	if diff := cmp.Diff(read(t0), want); diff != "" {
		t.Errorf("a gate is never shortened (-got +want):\n%s", diff)
	}
	if gs := read(t0.Add(time.Minute)); len(gs) != 0 {
		t.Errorf("a gate at its time: got %+v, want it open", gs)
	}
	put("", t0.Add(time.Hour), "circuit")
	put("policy-a", t0.Add(2*time.Minute), "problem")
	want = []ledger.Gate{
		{Key: "k", Until: t0.Add(time.Hour), Reason: reason.Reason{Kind: reason.Said, Said: "circuit"}, Source: "circuit", SetAt: t0},
		{Key: "k", Scope: "policy-a", Until: t0.Add(2 * time.Minute), Reason: reason.Reason{Kind: reason.Said, Said: "problem"}, Source: "problem", SetAt: t0},
	}
	if diff := cmp.Diff(read(t0), want); diff != "" {
		t.Errorf("a longer gate and a gate of one policy, the latest to open first (-got +want):\n%s", diff)
	}
	if gs := read(t0.Add(90 * time.Minute)); len(gs) != 0 {
		t.Errorf("every gate after its time: got %+v, want none", gs)
	}
}

func claims(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	update(t, s, func(tx ledger.Tx) error {
		return errors.Join(
			tx.Claim("k", "agent", t0.Add(time.Minute)),
			tx.Claim("k", "agent", t0.Add(time.Second)), // never shortened
			tx.Claim("k", "sync", t0.Add(10*time.Second)),
			tx.Claim("other", "x", t0.Add(time.Hour)))
	}, "k", "other")
	view(t, s, func(tx ledger.ReadTx) error {
		for now, want := range map[time.Time]map[string]bool{
			t0:                       {"agent": true, "sync": true},
			t0.Add(30 * time.Second): {"agent": true},
			t0.Add(time.Minute):      nil,
		} {
			got, err := tx.Claimed("k", now)
			if diff := cmp.Diff(got, want); err != nil || diff != "" {
				t.Errorf("Claimed at %v (-got +want):\n%s%v", now.Sub(t0), diff, err)
			}
		}
		return nil
	})
	update(t, s, func(tx ledger.Tx) error { return tx.Claim("k", "agent", t0.Add(2*time.Minute)) }, "k") // extended
	view(t, s, func(tx ledger.ReadTx) error {
		got, err := tx.Claimed("k", t0.Add(90*time.Second))
		if diff := cmp.Diff(got, map[string]bool{"agent": true}); diff != "" {
			t.Errorf("Claimed after a claim was extended (-got +want):\n%s", diff)
		}
		return err
	})
}

func keyState(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	ks := ledger.KeyState{Key: "k", LastAdmitAt: t0, Interval: 250 * time.Millisecond, LastResponseAt: t0.Add(time.Second),
		Failures: 2, Opens: 1, HalfOpen: true, ProbeAttempt: 9, ProbeUntil: t0.Add(time.Minute),
		Latency: 1500 * time.Microsecond, PrevLatency: 12 * time.Millisecond, LatencySince: t0.Add(-time.Second)}
	update(t, s, func(tx ledger.Tx) error { return tx.PutKeyState(ks) }, "k")
	read := func(key string) ledger.KeyState {
		var got ledger.KeyState
		view(t, s, func(tx ledger.ReadTx) error {
			var err error
			got, err = tx.KeyState(key)
			return err
		})
		return got
	}
	if diff := cmp.Diff(read("k"), ks); diff != "" {
		t.Errorf("KeyState (-got +want):\n%s", diff)
	}
	if got := read("never"); got != (ledger.KeyState{Key: "never"}) {
		t.Errorf("KeyState of a key never used: got %+v, want the zero state", got)
	}
	// Recorded again, whole: what is zero now reads zero.
	again := ledger.KeyState{Key: "k", LastAdmitAt: t0.Add(time.Hour), Failures: 0}
	update(t, s, func(tx ledger.Tx) error { return tx.PutKeyState(again) }, "k")
	if diff := cmp.Diff(read("k"), again); diff != "" {
		t.Errorf("KeyState recorded again (-got +want):\n%s", diff)
	}
}

func keys(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	update(t, s, func(tx ledger.Tx) error {
		return errors.Join(
			tx.PutKeyState(ledger.KeyState{Key: "b", LastAdmitAt: t0}),
			tx.PutSeenPolicy(ledger.SeenPolicy{Key: "a", ReceivedAt: t0, Observation: ratelimit.Observation{Policy: "p", Unit: ratelimit.Requests}}),
			tx.PutSeenPolicy(ledger.SeenPolicy{Key: "b", ReceivedAt: t0, Observation: ratelimit.Observation{Policy: "p", Unit: ratelimit.Requests}}))
	}, "a", "b")
	view(t, s, func(tx ledger.ReadTx) error {
		got, err := own(tx).Keys() // the state's own health check reads it; no consumer does
		if diff := cmp.Diff(got, []string{"a", "b"}); diff != "" {
			t.Errorf("Keys (-got +want):\n%s", diff)
		}
		return err
	})
}

// The failures of a key's routes: recorded per route, counted, forgotten
// once old, with the routes' gates that reopened; the key's own gate stays.
func pathFailures(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	put := func(ps ledger.PathState) {
		update(t, s, func(tx ledger.Tx) error { return tx.PutPathState(ps) }, ps.Key)
	}
	get := func(key, scope string) (ps ledger.PathState) {
		view(t, s, func(tx ledger.ReadTx) (err error) { ps, err = tx.PathState(key, scope); return err })
		return ps
	}
	failing := func(since time.Time) (n int) {
		view(t, s, func(tx ledger.ReadTx) (err error) { n, err = tx.FailingPaths("k", since); return err })
		return n
	}
	if diff := cmp.Diff(get("k", "route GET /a"), ledger.PathState{Key: "k", Scope: "route GET /a"}); diff != "" {
		t.Errorf("a route never failed (-got +want):\n%s", diff)
	}
	a := ledger.PathState{Key: "k", Scope: "route GET /a", Failures: 3, Opens: 1, HalfOpen: true, LastAt: t0}
	put(a)
	put(ledger.PathState{Key: "k", Scope: "route GET /b", Failures: 1, LastAt: t0.Add(time.Minute)})
	put(ledger.PathState{Key: "other", Scope: "route GET /a", Failures: 1, LastAt: t0.Add(time.Minute)})
	if diff := cmp.Diff(get("k", "route GET /a"), a); diff != "" {
		t.Errorf("a route's failures (-got +want):\n%s", diff)
	}
	a.Failures, a.LastAt = 4, t0.Add(time.Second)
	put(a)
	if diff := cmp.Diff(get("k", "route GET /a"), a); diff != "" {
		t.Errorf("a route's failures recorded again (-got +want):\n%s", diff)
	}
	if got := failing(t0); got != 2 {
		t.Errorf("routes failing after t0: %d, want 2", got)
	}
	if got := failing(t0.Add(time.Second)); got != 1 {
		t.Errorf("routes failing after t0+1s: %d, want 1", got)
	}
	update(t, s, func(tx ledger.Tx) error {
		for _, g := range []ledger.Gate{
			{Key: "k", Scope: "route GET /a", Until: t0.Add(10 * time.Second), Source: "backoff", Reason: reason.Reason{Kind: reason.Said, Said: "r"}, SetAt: t0},
			{Key: "k", Scope: "route GET /b", Until: t0.Add(5 * time.Minute), Source: "circuit", Reason: reason.Reason{Kind: reason.Said, Said: "r"}, SetAt: t0},
			{Key: "k", Until: t0.Add(10 * time.Second), Source: "retry-after", Reason: reason.Reason{Kind: reason.Said, Said: "r"}, SetAt: t0},
		} {
			if err := tx.PutGate(g); err != nil {
				return err
			}
		}
		return tx.ForgetPaths("k", t0.Add(30*time.Second))
	}, "k")
	if diff := cmp.Diff(get("k", "route GET /a"), ledger.PathState{Key: "k", Scope: "route GET /a"}); diff != "" {
		t.Errorf("an old route's failures after ForgetPaths (-got +want):\n%s", diff)
	}
	if got := get("k", "route GET /b"); got.Failures != 1 {
		t.Errorf("a recent route's failures after ForgetPaths: %+v, want kept", got)
	}
	if got := get("other", "route GET /a"); got.Failures != 1 {
		t.Errorf("another key's route after ForgetPaths: %+v, want kept", got)
	}
	var scopes []string
	view(t, s, func(tx ledger.ReadTx) error {
		gs, err := tx.Gates("k", t0)
		for _, g := range gs {
			scopes = append(scopes, g.Scope)
		}
		return err
	})
	if diff := cmp.Diff(scopes, []string{"route GET /b", ""}); diff != "" {
		t.Errorf("gates after ForgetPaths (-got +want):\n%s", diff)
	}
}
