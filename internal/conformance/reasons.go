package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
)

// reasons: why a gate closed and what a warning says are kept as data.
var reasons = []behaviour{
	{"a gate's and a warning's reason read back as data: its kind, policy and numbers", reasonsKept},
	{"a gate the pacer closes on a Retry-After reads back as the upstream's answer and wait", reasonOfPacersGate},
	{"the reasons of the attempts the pacer records read back as data: admitted, answered, failed, refused", reasonsOfPacersAttempts},
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
			w := ledger.Warning{Key: "k", At: t0.Add(time.Duration(i) * time.Second), Kind: ledger.WarningKind(why.Kind), Reason: why}
			if err := errors.Join(tx.PutGate(g), tx.AddWarning(w)); err != nil {
				return err
			}
		}
		return nil
	}, "k")
	var gates []ledger.Gate
	var warnings []ledger.Warning
	view(t, s, func(tx ledger.ReadTx) error {
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
	view(t, s, func(tx ledger.ReadTx) (err error) { gates, err = tx.Gates("k", now); return err })
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

// The attempts the pacer records keep their reasons as data: an
// admission that waited for the key's one call at once (why it waited),
// a request the upstream answered and one that failed, and a call
// refused for a spent window (the pause's reason and its retry-after)
// read back with their kinds, policies and numbers, and say what they
// said before.
func reasonsOfPacersAttempts(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	clk := clockOf(s)
	a := attemptsOf{t: t, s: s, clk: clk, p: pacer.New(s, pacer.WithClock(clk), pacer.WithJitter(func() float64 { return 0 }))}
	a.waitedAnsweredFailed()
	a.refused()
}

// attemptsOf is a pacer on a store, whose attempts' reasons are read back.
type attemptsOf struct {
	t   *testing.T
	s   state.Store
	clk clock.Clock
	p   *pacer.Pacer
}

// done ends tk with o, sent when admitted and answered now.
func (a attemptsOf) done(tk pacer.Ticket, o pacer.Outcome) {
	a.t.Helper()
	o.SentAt, o.AnsweredAt = tk.AdmittedAt, a.clk.Now()
	if _, err := a.p.Done(context.Background(), tk, o); err != nil {
		a.t.Fatal(err)
	}
}

// reasonOf returns the reason of key's attempt id, or of its latest
// attempt when id is 0.
func (a attemptsOf) reasonOf(key string, id int64) reason.Reason {
	a.t.Helper()
	var list []ledger.Attempt
	view(a.t, a.s, func(tx ledger.ReadTx) (err error) {
		list, err = tx.Activity(ledger.ActivityFilter{Key: key})
		return err
	})
	for _, at := range list {
		if id == 0 || at.ID == id {
			return at.Reason
		}
	}
	a.t.Fatalf("key %s's activity: %+v, want attempt %d", key, list, id)
	return reason.Reason{}
}

// waitedAnsweredFailed: on a key of one call at once, a second call
// waits while the first is in flight; the first is answered, the
// second, admitted after its wait, fails.
func (a attemptsOf) waitedAnsweredFailed() {
	t := a.t
	one := &keystore.Key{Name: "k", MaxRate: 1e6, MaxConcurrency: 1}
	first, err := admitOn(t, a.p, one, "A", "/items")
	if err != nil {
		t.Fatal(err)
	}
	// The second call waits while the first is in flight: the first
	// ends once the second has said it waits (its first progress, after
	// a second), whatever the machine's speed.
	waiting := make(chan reason.Reason, 1)
	admitted := make(chan pacer.Ticket, 1)
	go func() {
		tk, err := a.p.Admit(context.Background(), pacer.Call{Key: one, Caller: "B", Transport: "rest", Method: "GET",
			Target: "/items", CallID: "second", Attempt: 1, MaxWait: time.Minute, Progress: func(pr pacer.Progress) {
				select {
				case waiting <- pr.Reason:
				default:
				}
			}})
		if err != nil {
			t.Error(err)
		}
		admitted <- tk
	}()
	wantInFlight := reason.Reason{Kind: reason.InFlight, InFlight: 1}
	if got := <-waiting; got != wantInFlight {
		t.Errorf("the second call waits for %+v, want %+v", got, wantInFlight)
	}
	a.done(first, pacer.Outcome{Status: http.StatusOK})
	second := <-admitted
	if second.ID == 0 {
		t.FailNow()
	}
	if diff := cmp.Diff(a.reasonOf("k", first.ID), reason.Reason{Kind: reason.Answered, Status: http.StatusOK}); diff != "" {
		t.Errorf("an answered attempt's reason (-got +want):\n%s", diff)
	}
	if diff := cmp.Diff(a.reasonOf("k", 0), wantInFlight); diff != "" || second.HeldBy != string(pacer.ConcurrencyLimit) {
		t.Errorf("an attempt admitted after a wait, held by %q; why it waited, in the activity (-got +want):\n%s",
			second.HeldBy, diff)
	}
	failure := errors.New("dial tcp 127.0.0.1:9: connect: connection refused")
	a.done(second, pacer.Outcome{Err: failure})
	if diff := cmp.Diff(a.reasonOf("k", 0), reason.Reason{Kind: reason.Failed, Error: failure.Error()}); diff != "" {
		t.Errorf("a failed attempt's reason (-got +want):\n%s", diff)
	}
	if got := a.reasonOf("k", 0).String(); got != failure.Error() {
		t.Errorf("a failed attempt says %q, want the error, %q", got, failure.Error())
	}
}

// refused: the second call of one an hour is refused, and its attempt
// keeps the pause's reason and retry-after.
func (a attemptsOf) refused() {
	t := a.t
	hourly := &keystore.Key{Name: "h", MaxRate: 1e6, MaxConcurrency: 1000,
		Policies: []keystore.Policy{{Name: "hour", Quota: 1, Window: time.Hour, Unit: ratelimit.Requests}}}
	if _, err := admitOn(t, a.p, hourly, "A", "/items"); err != nil {
		t.Fatal(err)
	}
	_, err := admitOn(t, a.p, hourly, "B", "/items")
	var pe *pacer.PauseError
	if !errors.As(err, &pe) {
		t.Fatalf("the second call of one an hour: %v, want refused", err)
	}
	if pe.Reason.Kind != reason.WindowSpent || pe.Reason.Policy != "hour" || pe.Reason.Limit != 1 || pe.Reason.Window != time.Hour {
		t.Fatalf("the refusal's reason %+v, want policy hour's window spent", pe.Reason)
	}
	refused := a.reasonOf("h", 0)
	want := reason.Reason{Kind: reason.RefusedLocal, Because: reason.WindowSpent, RetryAfter: pe.RetryAfter,
		Policy: "hour", Limit: 1, Window: time.Hour}
	if diff := cmp.Diff(refused, want); diff != "" {
		t.Errorf("a refused call's reason (-got +want):\n%s", diff)
	}
	if got, want := refused.String(), reason.Refused(pe.RetryAfter, pe.Reason); got != want {
		t.Errorf("the refusal in the activity says %q, want %q", got, want)
	}
}
