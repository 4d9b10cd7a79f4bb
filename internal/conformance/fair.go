package conformance

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// fair: what a key's shares need across hosts.
var fair = []behaviour{
	{"a principal's window counts its own numbered admissions", principalWindow},
	{"waiting principals are seen by every process until their record ends or runs out", waiters},
}

// A principal's admissions are counted apart from the key's, through
// every caller name it records them under, from admissions recorded with
// its principal only.
func principalWindow(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	update(t, s, func(tx ledger.Tx) error {
		insertNumbered(t, tx, []ledger.Attempt{
			{Caller: "alice via Claude.ai", Principal: "alice", State: ledger.Admitted, At: t0},
			{Caller: "sync", Principal: "sync", State: ledger.Admitted, At: t0.Add(time.Second)},
			{Caller: "alice via VS Code", Principal: "alice", State: ledger.Admitted, At: t0.Add(2 * time.Second)},
			{Caller: "alice", Principal: "alice", State: ledger.RejectedLocal, At: t0.Add(3 * time.Second)}, // not counted
			{Caller: "sync", State: ledger.Admitted, At: t0.Add(4 * time.Second)},                           // recorded without a principal
			{Caller: "sync", Principal: "sync", State: ledger.Admitted, At: t0.Add(5 * time.Second)},
			{Key: "other", Caller: "alice", Principal: "alice", State: ledger.Admitted, At: t0.Add(6 * time.Second)},
		})
		return nil
	}, "k", "other")
	view(t, s, func(tx ledger.ReadTx) error {
		for since, want := range map[time.Time]map[string]ledger.Use{
			t0.Add(-time.Second):    {"alice": {Count: 2, Oldest: t0}, "sync": {Count: 2, Oldest: t0.Add(time.Second)}},
			t0:                      {"alice": {Count: 1, Oldest: t0.Add(2 * time.Second)}, "sync": {Count: 2, Oldest: t0.Add(time.Second)}},
			t0.Add(2 * time.Second): {"sync": {Count: 1, Oldest: t0.Add(5 * time.Second)}},
			t0.Add(time.Hour):       nil,
		} {
			got, err := tx.PrincipalWindow("k", since, []string{"alice", "sync", "nobody"})
			if diff := cmp.Diff(got, want); err != nil || diff != "" {
				t.Errorf("PrincipalWindow after t0%+v (-got +want):\n%s%v", since.Sub(t0), diff, err)
			}
		}
		return nil
	})
}

// Principals waiting for a key, in several processes: each waiter's
// record lasts until it runs out or is recorded anew (until now ends it),
// and one that ran out is forgotten by the next wait on the key.
func waiters(t *testing.T, b Backend) {
	s, loc := b.fresh(t)
	other := b.Open(t, loc) // another process, or host
	waiting := func(st ledger.Store, key string, now time.Time) []string {
		t.Helper()
		var got []string
		view(t, st, func(tx ledger.ReadTx) error {
			var err error
			got, err = tx.Waiting(key, now)
			return err
		})
		slices.Sort(got)
		return got
	}
	update(t, s, func(tx ledger.Tx) error {
		return errors.Join(
			tx.Wait("k", "alice", "w1", t0, t0.Add(time.Minute)),
			tx.Wait("k", "alice", "w1", t0, t0.Add(3*time.Second)), // recorded anew: shorter
			tx.Wait("k", "sync", "w1", t0, t0.Add(10*time.Second)),
			tx.Wait("other", "bob", "w1", t0, t0.Add(time.Hour)))
	}, "k", "other")
	update(t, other, func(tx ledger.Tx) error {
		return tx.Wait("k", "sync", "w2", t0, t0.Add(20*time.Second))
	}, "k")
	for now, want := range map[time.Time][]string{
		t0:                       {"alice", "sync"},
		t0.Add(5 * time.Second):  {"sync"},
		t0.Add(15 * time.Second): {"sync"},
		t0.Add(20 * time.Second): nil,
	} {
		if diff := cmp.Diff(waiting(other, "k", now), want); diff != "" {
			t.Errorf("Waiting at t0+%v (-got +want):\n%s", now.Sub(t0), diff)
		}
	}
	// sync's record in the first process ends; the second's holds.
	update(t, s, func(tx ledger.Tx) error { return tx.Wait("k", "sync", "w1", t0, t0) }, "k")
	if diff := cmp.Diff(waiting(other, "k", t0.Add(15*time.Second)), []string{"sync"}); diff != "" {
		t.Errorf("after w1's record ended: Waiting (-got +want):\n%s", diff)
	}
	update(t, other, func(tx ledger.Tx) error { return tx.Wait("k", "sync", "w2", t0, t0) }, "k")
	if got := waiting(s, "k", t0); !slices.Equal(got, []string{"alice"}) {
		t.Errorf("after both ended: Waiting = %v, want [alice]", got)
	}
	// A wait at t0+5s forgets alice's record, which ran out at t0+3s: a
	// look at an earlier instant no longer finds it.
	update(t, other, func(tx ledger.Tx) error {
		return tx.Wait("k", "carol", "w2", t0.Add(5*time.Second), t0.Add(time.Minute))
	}, "k")
	if diff := cmp.Diff(waiting(s, "k", t0), []string{"carol"}); diff != "" {
		t.Errorf("a record that ran out is forgotten by the next wait (-got +want):\n%s", diff)
	}
	if diff := cmp.Diff(waiting(s, "other", t0), []string{"bob"}); diff != "" {
		t.Errorf("another key's records are its own (-got +want):\n%s", diff)
	}
	// A sweep forgets every key's records that ran out, bob's among them.
	sweep(t, s, t0.Add(2*time.Hour), t0.Add(-time.Hour))
	for _, key := range []string{"k", "other"} {
		if got := waiting(other, key, t0); got != nil {
			t.Errorf("after a sweep at t0+2h: Waiting(%s) = %v, want none", key, got)
		}
	}
}
