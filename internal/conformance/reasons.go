package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// reasons: why a gate closed and what a warning says are kept as data.
var reasons = []behaviour{
	{"a gate's and a warning's reason read back as data: its kind, policy and numbers", reasonsKept},
	{"a gate the pacer closes on a Retry-After reads back as the upstream's answer and wait", reasonOfPacersGate},
}

// Gates and warnings of every shape of reason read back with each field
// as it was written.
func reasonsKept(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	whys := []reason.Reason{
		{Kind: reason.RetryAfterAsked, Status: 429, For: 18 * time.Second},
		{Kind: reason.Abnormal, Key: "k", Violated: "hourly daily", Until: t0.Add(15 * time.Minute)},
		{Kind: reason.BackOff, Status: 503, Failures: 3, Short: true, For: 200 * time.Millisecond},
		{Kind: reason.HiddenLimit, Key: "k", Policy: "hidden", Limit: 60, Window: time.Hour},
		{Kind: reason.UpstreamShort, Policy: "bytes", Unit: ratelimit.ContentBytes, Left: -3, For: time.Minute, Carries: 2048},
		{Kind: reason.ShareSpent, Principal: "alice", Share: 0.4, Used: 40, Limit: 100, Window: time.Minute, Policy: "default", Left: 7},
		{Kind: reason.BucketFull, Policy: "leaky", Limit: 40, Rate: 2.5, For: 400 * time.Millisecond},
		{Kind: reason.RouteCircuit, Route: "GET /items", Key: "k", For: time.Minute},
		{Kind: reason.Said, Said: "words only"},
	}
	update(t, s, func(tx ledger.Tx) error {
		for i, why := range whys {
			g := ledger.Gate{Key: "k", Scope: fmt.Sprintf("route GET /%d", i), Until: t0.Add(time.Duration(i+1) * time.Hour),
				Source: ledger.BackoffGate, SetAt: t0, Reason: why}
			w := ledger.Warning{Key: "k", At: t0.Add(time.Duration(i) * time.Second), Kind: string(why.Kind), Reason: why}
			if err := errors.Join(tx.PutGate(g), tx.AddWarning(w)); err != nil {
				return err
			}
		}
		return nil
	}, "k")
	var gates []ledger.Gate
	var warnings []ledger.Warning
	view(t, s, func(tx ledger.Tx) error {
		var err1, err2 error
		gates, err1 = tx.Gates("k", t0)
		warnings, err2 = tx.Warnings("k", t0.Add(-time.Second))
		return errors.Join(err1, err2)
	})
	var gotGates, gotWarnings []reason.Reason
	for i := range gates { // the latest to open first
		gotGates = append([]reason.Reason{gates[i].Reason}, gotGates...)
	}
	for i := range warnings { // the newest first
		gotWarnings = append([]reason.Reason{warnings[i].Reason}, gotWarnings...)
	}
	if diff := cmp.Diff(gotGates, whys); diff != "" {
		t.Errorf("gates' reasons (-got +want):\n%s", diff)
	}
	if diff := cmp.Diff(gotWarnings, whys); diff != "" {
		t.Errorf("warnings' reasons (-got +want):\n%s", diff)
	}
}

// The pacer gates a key on a 429 with Retry-After: the gate, as the store
// reads it back (on PostgreSQL, in the admission's own read too), says
// the upstream's status and wait, and the next call is refused for it.
func reasonOfPacersGate(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	p := pacer.New(s, pacer.WithClock(clockOf(s)), pacer.WithJitter(func() float64 { return 0 }))
	k := &keystore.Key{Name: "k", MaxRate: 1e6, MaxConcurrency: 1000}
	tk, err := admitOn(t, p, k, "A", "/items")
	if err != nil {
		t.Fatal(err)
	}
	now := clockOf(s).Now()
	if _, err := p.Done(context.Background(), tk, pacer.Outcome{SentAt: tk.AdmittedAt, AnsweredAt: now, Status: http.StatusTooManyRequests,
		Reading: &ratelimit.Reading{ReceivedAt: now, HasRetryAfter: true, RetryAfter: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	want := reason.Reason{Kind: reason.RetryAfterAsked, Status: http.StatusTooManyRequests, For: time.Hour}
	var gates []ledger.Gate
	view(t, s, func(tx ledger.Tx) (err error) { gates, err = tx.Gates("k", now); return err })
	if len(gates) != 1 {
		t.Fatalf("gates after a 429 with Retry-After: %+v, want one", gates)
	}
	if diff := cmp.Diff(gates[0].Reason, want); diff != "" || gates[0].Source != ledger.RetryAfterGate {
		t.Errorf("the gate's source %q, reason (-got +want):\n%s", gates[0].Source, diff)
	}
	_, err = admitOn(t, p, k, "B", "/items")
	var pe *pacer.PauseError
	if !errors.As(err, &pe) {
		t.Fatalf("the next call: %v, want refused", err)
	}
	if diff := cmp.Diff(pe.Reason, want); diff != "" {
		t.Errorf("the refusal's reason (-got +want):\n%s", diff)
	}
}
