package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/state"
)

// bounds: what an upstream announces, and what a failing route costs the
// key, as the pacer keeps them in the store.
var bounds = []behaviour{
	{"a flood of policies leaves the bound kept, and what still binds keeps binding", policyFlood},
	{"a route failing without a signal backs off alone, until failures spread", routeBackoff},
}

// pacerOn returns a Pacer on s, on the clock admissions are recorded by.
func pacerOn(s state.Store) *pacer.Pacer {
	// Backoffs at their longest (about 2 s from the first failure): a
	// slow machine does not outlast one between two statements.
	return pacer.New(s, pacer.WithClock(clockOf(s)), pacer.WithJitter(func() float64 { return 0.999 }))
}

// clockOf returns the clock admissions in s are recorded by: the
// server's, for PostgreSQL.
func clockOf(s state.Store) clock.Clock {
	if pg, ok := backend(s).(*state.Postgres); ok {
		return clock.Source(pg.Now)
	}
	return clock.Real
}

func boundKey() *keystore.Key {
	return &keystore.Key{Name: "k", MaxRate: 1e6, MaxConcurrency: 1000}
}

func admitOn(t *testing.T, p *pacer.Pacer, k *keystore.Key, caller, path string) (pacer.Ticket, error) {
	t.Helper()
	return p.Admit(context.Background(), pacer.Call{Key: k, Caller: caller, Transport: "rest", Method: "GET", Target: path,
		CallID: fmt.Sprintf("%s %s %d", caller, path, time.Now().UnixNano()), Attempt: 1})
}

func answerOn(t *testing.T, s state.Store, p *pacer.Pacer, tk pacer.Ticket, status int, obs ...ratelimit.Observation) pacer.Result {
	t.Helper()
	now := clockOf(s).Now()
	res, err := p.Done(context.Background(), tk, pacer.Outcome{SentAt: tk.AdmittedAt, AnsweredAt: now, Status: status,
		Reading: &ratelimit.Reading{ReceivedAt: now, Observations: obs}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func spentFor(name string, t time.Duration) ratelimit.Observation {
	return ratelimit.Observation{Policy: name, Unit: ratelimit.Requests, Quota: 1000, HasQuota: true, Window: time.Hour,
		Remaining: 0, HasRemaining: true, Reset: t, HasReset: true, Shape: ratelimit.ShapeDraft}
}

// An upstream announces 64 new policies on each answer: the store keeps
// the bound, and the oldest spent policy, folded, still refuses calls.
func policyFlood(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	p := pacerOn(s)
	k := boundKey()
	var tickets []pacer.Ticket
	for range 4 {
		tk, err := admitOn(t, p, k, "B", "/items")
		if err != nil {
			t.Fatal(err)
		}
		tickets = append(tickets, tk)
	}
	answerOn(t, s, p, tickets[0], http.StatusOK, spentFor("tight", 30*time.Minute))
	for i, tk := range tickets[1:] {
		var obs []ratelimit.Observation
		for j := range 64 {
			obs = append(obs, spentFor(fmt.Sprintf("p%d-%d", i, j), time.Minute))
		}
		answerOn(t, s, p, tk, http.StatusOK, obs...)
	}
	var known []ledger.SeenPolicy
	view(t, s, func(tx ledger.ReadTx) (err error) { known, err = tx.SeenPolicies("k"); return err })
	if len(known) > pacer.MaxPolicies+1 {
		t.Errorf("policies kept after 192 announced: %d, want at most %d and the folded one", len(known), pacer.MaxPolicies)
	}
	_, err := admitOn(t, p, k, "A", "/other")
	var pe *pacer.PauseError
	if !errors.As(err, &pe) || pe.RetryAfter < 29*time.Minute {
		t.Errorf("a call after the flood: %v, want refused for what is left of tight's 30 minutes", err)
	}
}

// Two failures of B's route do not refuse A's call on another route;
// failures on PathSpread routes back off the whole key.
func routeBackoff(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	p := pacerOn(s)
	k := boundKey()
	tk, err := admitOn(t, p, k, "B", "/bad")
	if err != nil {
		t.Fatal(err)
	}
	answerOn(t, s, p, tk, http.StatusServiceUnavailable)
	var pe *pacer.PauseError
	if _, err := admitOn(t, p, k, "B", "/bad"); !errors.As(err, &pe) || pe.Source != "backoff" {
		t.Errorf("B again on /bad: %v, want its route's backoff", err)
	}
	if _, err := admitOn(t, p, k, "A", "/good"); err != nil {
		t.Errorf("A on /good after B's route failed: %v, want admitted", err)
	}
	for i := 1; i < pacer.PathSpread; i++ {
		tk, err := admitOn(t, p, k, "A", fmt.Sprintf("/p%d", i))
		if err != nil {
			t.Fatalf("route %d: %v, want admitted", i, err)
		}
		answerOn(t, s, p, tk, http.StatusBadGateway)
	}
	if _, err := admitOn(t, p, k, "A", "/elsewhere"); !errors.As(err, &pe) || pe.Source != "backoff" {
		t.Errorf("after failures on %d routes: %v, want the key's backoff", pacer.PathSpread, err)
	}
}
