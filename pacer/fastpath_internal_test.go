package pacer

import (
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// deferringStore is a store whose outcomes go through the process's
// journal (see deferrer); quickBudgets asks nothing else of it.
type deferringStore struct{ ledger.Store }

func (deferringStore) DefersOutcomes() bool { return true }

// quickBudgets, rule by rule, at one instant: an admission of a key this
// process calls 8,000 times a second, far from a budget of 100,000 a
// minute, has its answer judged routine by the budget with the call spent;
// each case changes one thing that makes the answer one to record in a
// transaction of its own (nil).
func TestQuickBudgets(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	type setup struct {
		snap  snapshot
		d     decision
		busy  *admissions // the key's latest admissions in this process
		store ledger.Store
	}
	for _, tt := range []struct {
		name    string
		change  func(*setup)
		routine bool
	}{
		{"as it is", func(*setup) {}, true},
		{"a store that records every answer at once", func(s *setup) { s.store = nil }, false},
		// One call in two seconds: fewer than quickNext admissions of the
		// key here in the second what the answer taught may wait (a
		// window of a minute): it would wait for a transaction of its own.
		{"a key seldom called here", func(s *setup) {
			s.busy = &admissions{}
			for i := range leaseRecent {
				s.busy.note(now.Add(time.Duration(i-leaseRecent) * 2 * time.Second))
			}
		}, false},
		// Three a second: enough when what the answer taught may wait a
		// second (a window of a minute), not when it waits LeaseTime.
		{"a key called three times a second", func(s *setup) {
			s.busy = &admissions{}
			for i := range leaseRecent {
				s.busy.note(now.Add(time.Duration(i-leaseRecent) * time.Second / 3))
			}
		}, true},
		// One and a half a second: the next admission, usually, comes
		// within the second. A host calls its keys less often when the
		// machine is busy, and their answers must not then take
		// transactions of their own (see quickNext).
		{"a key called one and a half times a second", func(s *setup) {
			s.busy = &admissions{}
			for i := range leaseRecent {
				s.busy.note(now.Add(time.Duration(i-leaseRecent) * time.Second * 2 / 3))
			}
		}, true},
		{"a key called three times a second, its window 2 s", func(s *setup) {
			s.busy = &admissions{}
			for i := range leaseRecent {
				s.busy.note(now.Add(time.Duration(i-leaseRecent) * time.Second / 3))
			}
			s.d.budgets[0].Window = 2 * time.Second
		}, false},
		{"a probe", func(s *setup) { s.d.probe = true }, false},
		{"calls spread below the low-water mark", func(s *setup) { s.d.slow = true }, false},
		{"a gate of one route", func(s *setup) {
			s.snap.gates = []ledger.Gate{{Key: "k", Scope: "route GET /other", Until: now.Add(time.Second), Source: ledger.BackoffGate}}
		}, false},
		{"a reservation", func(s *setup) { s.snap.key.Reserves = []keystore.Reserve{{Caller: "agent", Share: 0.2}} }, false},
		{"failures behind it", func(s *setup) { s.snap.ks.Failures = 1 }, false},
		{"a circuit that opened before", func(s *setup) { s.snap.ks.Opens = 1 }, false},
		{"a circuit half open", func(s *setup) { s.snap.ks.HalfOpen = true }, false},
		{"a probe out", func(s *setup) { s.snap.ks.ProbeAttempt = 7 }, false},
		{"a partitioned policy", func(s *setup) {
			s.snap.seen = []ledger.SeenPolicy{{Observation: ratelimit.Observation{Policy: "p", Partition: "b-1", Unit: ratelimit.Requests}}}
		}, false},
		{"the last call the budget allows", func(s *setup) { s.d.budgets[0].Remaining = 1 }, false},
		{"two left", func(s *setup) { s.d.budgets[0].Remaining = 2 }, true},
		{"an observation past its window, counted from the log", func(s *setup) {
			s.d.budgets[0].Observed, s.d.budgets[0].Expired, s.d.budgets[0].Reset = now.Add(-time.Minute), true, 30*time.Second
		}, false},
		{"an observation at its reset", func(s *setup) { s.d.budgets[0].Observed = now.Add(-time.Minute) }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k := &keystore.Key{Name: "k", MaxRate: 1e6, MaxConcurrency: 10_000}
			s := &setup{snap: snapshot{now: now, key: k}, d: decision{admit: true, budgets: []Budget{
				{Policy: "default", Unit: ratelimit.Requests, Limit: 100_000, Window: time.Minute, Remaining: 50_000},
			}}, busy: busyAt(now), store: deferringStore{}}
			tt.change(s)
			p := &Pacer{db: s.store, recent: map[string]*admissions{k.Name: s.busy}, leases: map[string]*lease{}}
			if got := p.quickBudgets(s.snap, s.d); (got != nil) != tt.routine {
				t.Errorf("quickBudgets = %+v; want routine: %v", got, tt.routine)
			}
		})
	}
}

// learnedWait: a tenth of the shortest window and a quarter of the
// soonest reset announced, between LeaseTime and a second.
func TestLearnedWait(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name    string
		budgets []Budget
		want    time.Duration
	}{
		{"no budget", nil, learnedWaitMax},
		{"an hour's window", []Budget{{Window: time.Hour}}, time.Second},
		{"a 5-s window", []Budget{{Window: 5 * time.Second}}, 500 * time.Millisecond},
		{"a 100-ms window", []Budget{{Window: 100 * time.Millisecond}}, LeaseTime},
		{"the shortest of two windows", []Budget{{Window: time.Hour}, {Window: 4 * time.Second}}, 400 * time.Millisecond},
		{"a reset announced in 2 s", []Budget{{Window: time.Hour, Observed: now, Reset: 2 * time.Second}}, 500 * time.Millisecond},
		{"a reset not announced", []Budget{{Window: time.Hour, Reset: 2 * time.Second}}, time.Second},
	} {
		if got := learnedWait(tt.budgets); got != tt.want {
			t.Errorf("%s: learnedWait = %v; want %v", tt.name, got, tt.want)
		}
	}
}
