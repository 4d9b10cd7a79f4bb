package pacer_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// known returns every policy the state keeps of k.
func (e *env) known(k *keystore.Key) []ledger.SeenPolicy {
	e.t.Helper()
	var ks []ledger.SeenPolicy
	err := e.db.View(context.Background(), func(tx ledger.ReadTx) error {
		var err error
		ks, err = tx.SeenPolicies(k.Name)
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return ks
}

// An upstream that announces 64 new policies on each of 16 answers (30
// times the bound) leaves at most the bound kept; a policy that still binds when it is
// evicted keeps binding through the folded policy until it would have
// expired; the bound is warned of once.
func TestPolicyFloodIsBounded(t *testing.T) {
	e := newEnv(t)
	k := newKey()
	k.MaxConcurrency = 1000
	const answers, perAnswer = 16, 64
	tickets := make([]pacer.Ticket, answers)
	for i := range tickets {
		tickets[i] = e.mustAdmit(k, "B", "/items")
		e.clk.advance(time.Millisecond)
	}
	// The first answer says the key is spent for 30 minutes; each later
	// one, as spent, announces 64 policies never seen, each spent for a
	// minute.
	warned := 0
	for i, tk := range tickets {
		rd := reading(0, shown("tight", 1000, time.Hour, 0, 30*time.Minute))
		if i > 0 {
			rd = reading(0)
			for j := range perAnswer {
				rd.Observations = append(rd.Observations, shown(fmt.Sprintf("p%d-%d", i, j), 1000, time.Hour, 0, time.Minute))
			}
		}
		res := e.answer(tk, http.StatusOK, rd)
		for _, w := range res.Warnings {
			if strings.Contains(w.String(), "more than mcp-quota keeps") {
				warned++
			}
		}
		e.clk.advance(10 * time.Millisecond)
	}
	ks := e.known(k)
	if len(ks) > pacer.MaxPolicies+1 {
		t.Fatalf("policies kept after %d announced: %d, want at most %d and the folded one", answers*perAnswer, len(ks), pacer.MaxPolicies)
	}
	if warned != 1 {
		t.Errorf("warnings of the bound: %d, want 1", warned)
	}
	// Every announced policy is gone but the folded one still holds what
	// 'tight' held back: nothing goes before its 30 minutes are over.
	e.clk.advance(5 * time.Minute)
	pe := e.mustPause(k, "A", "/other")
	if pe.Source != pacer.EvictedPolicy {
		t.Errorf("at 5 min: refused by %q (%s), want %q", pe.Source, pe.Reason, pacer.EvictedPolicy)
	}
	if pe.RetryAfter < 20*time.Minute {
		t.Errorf("at 5 min: retry after %s, want what is left of tight's 30 min", pe.RetryAfter)
	}
	// Nor any sooner than 'tight' would have allowed: 1000 per hour.
	e.clk.Set(start.Add(31 * time.Minute))
	e.mustAdmit(k, "A", "/other")
	st := e.status(k, "A")
	if b := upstreamBudget(t, st, pacer.EvictedPolicy); b.Limit != 1000 || b.Window != time.Hour {
		t.Errorf("folded policy: q=%d w=%s, want the least quota over the longest window (1000 per 1h)", b.Limit, b.Window)
	}
}

// A Discord bucket belongs to the route that reported it: a call on
// another route does not wait for it, and 300 routes, more than the
// buckets kept, do not make each call meet 300 buckets.
func TestDiscordBucketsHoldForTheirRoute(t *testing.T) {
	const routes = 300 // more than MaxRouteBuckets
	e := newEnv(t)
	k := newKey()
	k.Profile = ratelimit.Discord
	bucket := func(name string, r int64) *ratelimit.Reading {
		return reading(0, ratelimit.Observation{Unit: ratelimit.Requests, Partition: name, Quota: 5, HasQuota: true,
			Remaining: r, HasRemaining: true, Reset: 5 * time.Second, HasReset: true, Shape: ratelimit.ShapeVendor, Profile: ratelimit.Discord})
	}
	e.answer(e.mustAdmit(k, "B", "/channels/1/messages"), http.StatusOK, bucket("b-1", 0))
	e.clk.advance(time.Millisecond)
	// The bucket binds its own route…
	if pe := e.mustPause(k, "B", "/channels/1/messages"); pe.RetryAfter < 4*time.Second {
		t.Errorf("the spent bucket's route: retry after %s, want about 5 s", pe.RetryAfter)
	}
	// …and no other. (Calls come 50 ms apart: at most 100 buckets are live
	// at once, under the bound.) Each transaction reads every bucket
	// kept, twice under e.p's rerun: seconds of CPU under -race. So
	// another process on the state, its transactions run once, admits
	// them, but for the first ones past the bound, whose answers evict
	// a bucket each: e.p's transactions run twice there.
	once := e.pacerOn(e.db)
	for i := 2; i <= routes; i++ {
		p := once
		if i > pacer.MaxRouteBuckets && i <= pacer.MaxRouteBuckets+8 {
			p = e.p
		}
		path := fmt.Sprintf("/channels/%d/messages", i)
		tk, err := e.admitWith(p, e.call(k, "A", path))
		if err != nil {
			t.Fatalf("route %d: %v, want admitted (its bucket is not known yet)", i, err)
		}
		answerWith(t, p, e.clk, tk, http.StatusOK, bucket(fmt.Sprintf("b-%d", i), 0))
		e.clk.advance(50 * time.Millisecond)
	}
	if n := len(e.known(k)); n > pacer.MaxRouteBuckets+1 {
		t.Errorf("buckets kept after %d routes: %d, want at most %d and the folded policy", routes, n, pacer.MaxRouteBuckets)
	}
}
