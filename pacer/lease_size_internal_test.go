package pacer

import (
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// leaseSize, rule by rule, at one instant: a key this process admitted
// 8 calls of in the last millisecond (8,000 a second), with a budget of
// 100,000 a minute of which 50,000 are left, is leased LeaseMax slots for
// LeaseTime; each case changes one thing.
func TestLeaseSize(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	type setup struct {
		k    *keystore.Key
		snap snapshot
		d    decision
	}
	budget := func() Budget {
		return Budget{Policy: "default", Unit: ratelimit.Requests, Limit: 100_000, Window: time.Minute, Remaining: 50_000}
	}
	for _, tt := range []struct {
		name     string
		change   func(*setup)
		want     int
		wantLife time.Duration
	}{
		{"as it is", func(*setup) {}, LeaseMax, LeaseTime},
		// A key with something to watch for: each call is decided alone.
		{"a probe", func(s *setup) { s.d.probe = true }, 0, 0},
		{"calls spread below the low-water mark", func(s *setup) { s.d.slow = true }, 0, 0},
		{"a slow start after a failure", func(s *setup) { s.snap.ks.Interval = 10 * time.Millisecond }, 0, 0},
		{"failures behind it", func(s *setup) { s.snap.ks.Failures = 1 }, 0, 0},
		{"a circuit half open", func(s *setup) { s.snap.ks.HalfOpen = true }, 0, 0},
		{"an observation past its window, counted from the log", func(s *setup) {
			s.d.budgets[0].Observed, s.d.budgets[0].Expired, s.d.budgets[0].Reset = now.Add(-time.Minute), true, 30*time.Second
		}, 0, 0},
		// What a slot is admitted without: reservations, shares, bytes.
		{"a key with reservations", func(s *setup) { s.k.Reserves = []keystore.Reserve{{Caller: "agent", Share: 0.2}} }, 0, 0},
		{"a key with shares", func(s *setup) { s.k.Shares = []keystore.Share{{Principal: "*", Share: 0.5}} }, 0, 0},
		{"a key counting bytes", func(s *setup) {
			s.k.Policies = append(s.k.Policies, keystore.Policy{Name: "bytes", Quota: 1 << 30, Window: time.Hour, Unit: ratelimit.ContentBytes})
		}, 0, 0},
		// A lease's slots are counted at its grant: it lasts a small part
		// of the shortest window, and of an observation's reset.
		{"a 2-s window", func(s *setup) { s.d.budgets[0].Window = 2 * time.Second }, LeaseMax, 2 * time.Second / leaseWindowShare},
		{"an observation ending in 100 ms", func(s *setup) {
			s.d.budgets[0].Observed, s.d.budgets[0].Reset = now.Add(-time.Second), 100*time.Millisecond
		}, LeaseMax, 25 * time.Millisecond},
		{"a window too short for a lease worth its time", func(s *setup) { s.d.budgets[0].Window = 200 * time.Millisecond }, 0, 0},
		// At most a sixteenth of what is left but the call's own.
		{"257 left", func(s *setup) { s.d.budgets[0].Remaining = 257 }, leaseMin, LeaseTime},
		{"256 left", func(s *setup) { s.d.budgets[0].Remaining = 256 }, 0, 0},
		// A quarter of the calls that may still be in flight, but this one.
		{"68 at once", func(s *setup) { s.k.MaxConcurrency = 68 }, 16, LeaseTime},
		{"an upstream's 40 at once", func(s *setup) {
			s.snap.seen = []ledger.SeenPolicy{{Observation: ratelimit.Observation{Policy: "conc", Unit: ratelimit.ConcurrentRequests, Quota: 40, HasQuota: true}}}
		}, 0, 0},
		// No more than the key's rate allows in the lease's time.
		{"100 a second at most", func(s *setup) { s.k.MaxRate = 100 }, 25, LeaseTime},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k := &keystore.Key{Name: "k", MaxRate: 1e6, MaxConcurrency: 10_000,
				Policies: []keystore.Policy{{Name: "default", Quota: 100_000, Window: time.Minute, Unit: ratelimit.Requests}}}
			s := &setup{k: k, snap: snapshot{now: now, key: k}, d: decision{admit: true, budgets: []Budget{budget()}}}
			tt.change(s)
			busy := busyAt(now)
			p := &Pacer{recent: map[string]*admissions{k.Name: busy}, leases: map[string]*lease{}}
			if n, life := p.leaseSize(s.snap, s.d); n != tt.want || life != tt.wantLife {
				t.Errorf("leaseSize = %d slots for %v, want %d for %v", n, life, tt.want, tt.wantLife)
			}
		})
	}
	t.Run("a lease of the key current", func(t *testing.T) {
		k := &keystore.Key{Name: "k", MaxRate: 1e6, MaxConcurrency: 10_000}
		busy := busyAt(now)
		p := &Pacer{recent: map[string]*admissions{k.Name: busy}, leases: map[string]*lease{k.Name: {key: k.Name}}}
		if n, life := p.leaseSize(snapshot{now: now, key: k}, decision{admit: true, budgets: []Budget{budget()}}); n != 0 || life != 0 {
			t.Errorf("leaseSize = %d slots for %v, want none: one lease of a key at a time", n, life)
		}
	})
}

// busyAt is a key's latest admissions in a process that admitted
// leaseRecent of them a millisecond before now: 8,000 a second.
func busyAt(now time.Time) *admissions {
	a := &admissions{}
	for range leaseRecent {
		a.note(now.Add(-time.Millisecond))
	}
	return a
}
