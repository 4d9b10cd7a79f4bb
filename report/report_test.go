package report

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// statuses is a fake statuser: a fixed status per key.
type statuses map[string]pacer.KeyStatus

func (s statuses) Status(_ context.Context, k *keystore.Key, _ string) (pacer.KeyStatus, error) {
	return s[k.Name], nil
}

// agent is the caller the tests' reports are for.
var agent = &keystore.Caller{Name: "agent"}

func key(name string) *keystore.Key {
	u, _ := url.Parse("https://api.example/")
	return &keystore.Key{Name: name, BaseURL: u}
}

func TestBuild(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	observed := now.Add(-18 * time.Second)
	local := pacer.Budget{Policy: "default", Unit: ratelimit.Requests, Limit: 120, Used: 3, Remaining: 117, Reset: 41500 * time.Millisecond, Window: time.Minute, Source: "local"}
	up := pacer.Budget{Policy: "day", Unit: ratelimit.Requests, Limit: 5000, Remaining: 0, Reset: 90 * time.Second, Window: 24 * time.Hour, Source: "draft-11", Observed: observed}
	generous := pacer.Budget{Policy: "default", Unit: ratelimit.Requests, Limit: 120, Remaining: 119, Reset: 30 * time.Second, Window: time.Minute, Source: "draft-11", Observed: observed}
	st := statuses{
		"calm": {Key: "calm", Local: []pacer.Budget{local}, Upstream: []pacer.Budget{generous}, Binding: &local,
			Advice: pacer.Advice{Action: pacer.Continue, Why: reason.Reason{Kind: reason.CallsLeft, Left: 117, For: 41500 * time.Millisecond}}},
		"spent": {Key: "spent", Upstream: []pacer.Budget{up}, Binding: &up,
			Gates:  []ledger.Gate{{Scope: "", Until: now.Add(90 * time.Second), Source: "retry-after", Reason: reason.Reason{Kind: reason.Said, Said: "the upstream asked to wait"}}},
			Advice: pacer.Advice{Action: pacer.Pause, RetryAfter: 90 * time.Second, Why: reason.Reason{Kind: reason.Said, Said: "the upstream asked to wait"}}},
	}
	got, err := Build(context.Background(), st, []*keystore.Key{key("calm"), key("spent")}, agent, now)
	if err != nil {
		t.Fatal(err)
	}
	want := Status{
		Caller: "agent",
		Keys: []KeyStatus{
			// The most constrained first: spent pauses.
			{Key: "spent", Credential: "ok", Local: []Local{},
				Upstream: []Upstream{{Policy: "day", Unit: "requests", Q: 5000, W: 86400, R: 0, T: 90,
					ObservedAt: "2026-11-30T11:59:42Z", AgeS: 18, Source: "draft-11", Binds: true}},
				RetryAfter: &Gate{Until: "2026-11-30T12:01:30Z", RetryAfterS: 90, Source: "retry-after", Reason: "the upstream asked to wait"},
				Quota:      Quota{Key: "spent", Policy: "day", Unit: "requests", Limit: 5000, Remaining: 0, ResetS: 90, WindowS: 86400, Source: "draft-11", ObservedAt: "2026-11-30T11:59:42Z"},
				Advice:     Advice{Action: "pause", RetryAfterS: 90, Reason: "Wait 90 s before the next call: the upstream asked to wait."}},
			{Key: "calm", Credential: "ok",
				// The upstream's r=119 is beside the local count; the local one binds.
				Upstream: []Upstream{{Policy: "default", Unit: "requests", Q: 120, W: 60, R: 119, T: 30,
					ObservedAt: "2026-11-30T11:59:42Z", AgeS: 18, Source: "draft-11"}},
				Local:  []Local{{Policy: "default", Unit: "requests", Limit: 120, Used: 3, Remaining: 117, ResetS: 42, WindowS: 60, Binds: true}},
				Quota:  Quota{Key: "calm", Policy: "default", Unit: "requests", Limit: 120, Remaining: 117, ResetS: 42, WindowS: 60, Source: "local"},
				Advice: Advice{Action: "continue", Reason: "You can make 117 more calls in the next 42 s."}},
		},
		Advice: Advice{Action: "pause", RetryAfterS: 90, Reason: "Key 'spent': Wait 90 s before the next call: the upstream asked to wait."},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Build mismatch (-want +got):\n%s", diff)
	}
}

func TestBuildWithNoKeys(t *testing.T) {
	got, err := Build(context.Background(), statuses{}, nil, agent, time.Now())
	if err != nil || len(got.Keys) != 0 || got.Keys == nil || got.Advice.Action != "continue" {
		t.Errorf("Build(no keys) = %+v, %v; want an empty list and continue", got, err)
	}
}

func TestSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{-time.Second: 0, 0: 0, time.Nanosecond: 1, time.Second: 1, 1500 * time.Millisecond: 2} {
		if got := Seconds(d); got != want {
			t.Errorf("Seconds(%v) = %d, want %d", d, got, want)
		}
	}
}

// A key shows at most MaxUpstream upstream policies, the most constrained,
// and counts the others, whatever the upstream announced.
func TestBuildShowsAtMostMaxUpstream(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	var ups []pacer.Budget
	for i := range 40 {
		ups = append(ups, pacer.Budget{Policy: fmt.Sprintf("p%02d", i), Unit: ratelimit.Requests, Limit: 100,
			Remaining: int64(100 - i), Reset: time.Minute, Window: time.Hour, Source: "draft-11", Observed: now})
	}
	got, err := Build(context.Background(), statuses{"k": {Key: "k", Upstream: ups}}, []*keystore.Key{key("k")}, agent, now)
	if err != nil {
		t.Fatal(err)
	}
	ks := got.Keys[0]
	if len(ks.Upstream) != MaxUpstream || ks.UpstreamNotShown != 40-MaxUpstream {
		t.Fatalf("shows %d upstream policies and %d not shown, want %d and %d", len(ks.Upstream), ks.UpstreamNotShown, MaxUpstream, 40-MaxUpstream)
	}
	if first, last := ks.Upstream[0].Policy, ks.Upstream[MaxUpstream-1].Policy; first != "p39" || last != "p24" {
		t.Errorf("shows %s … %s, want the most constrained: p39 … p24", first, last)
	}
}

// TestBuildAdvisesForTheKeyShownFirst: with two keys pausing, the overall
// advice is the one of the key a page lists first (the smaller share
// left), whatever the configuration's order.
func TestBuildAdvisesForTheKeyShownFirst(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	pausing := func(name string, left int64, wait time.Duration) pacer.KeyStatus {
		b := pacer.Budget{Policy: "default", Unit: ratelimit.Requests, Limit: 100, Remaining: left, Reset: wait, Window: time.Minute, Source: "local"}
		return pacer.KeyStatus{Key: name, Local: []pacer.Budget{b}, Binding: &b,
			Advice: pacer.Advice{Action: pacer.Pause, RetryAfter: wait, Why: reason.Reason{Kind: reason.Said, Said: "the upstream asked to wait"}}}
	}
	st := statuses{"roomy": pausing("roomy", 40, 33*time.Second), "tight": pausing("tight", 2, 47*time.Second)}
	for _, order := range [][]string{{"roomy", "tight"}, {"tight", "roomy"}} {
		got, err := Build(context.Background(), st, []*keystore.Key{key(order[0]), key(order[1])}, agent, now)
		if err != nil {
			t.Fatal(err)
		}
		first := got.Page(0, 0).Keys[0]
		if first.Key != "tight" || got.Advice.RetryAfterS != first.Advice.RetryAfterS || got.Advice.Reason != "Key 'tight': "+first.Advice.Reason {
			t.Errorf("keys in the order %v: advice %+v, the first key shown %q (%+v); want the advice of tight, shown first", order, got.Advice, first.Key, first.Advice)
		}
	}
}

// TestBuildNamesOnlyTheReservationsTheCallerSees: a person signed in with
// OAuth, who sees only their own calls, is not told which other
// principals reserve a share of the key; a caller without a Sight (a
// [[callers]] token) and the command line (nil) are told every one.
func TestBuildNamesOnlyTheReservationsTheCallerSees(t *testing.T) {
	st := statuses{"k": {Key: "k", Reserves: []keystore.Reserve{{Caller: "alice@example.com", Share: 0.2}, {Caller: "nightly-sync", Share: 0.3}}}}
	alice := &keystore.Caller{Name: "alice@example.com via Claude.ai", Keys: []string{"k"}, Sight: &keystore.Sight{Principals: []string{"alice@example.com"}}}
	for _, tt := range []struct {
		caller *keystore.Caller
		want   []Reservation
	}{
		{alice, []Reservation{{Caller: "alice@example.com", Share: 0.2}}},
		{agent, []Reservation{{Caller: "alice@example.com", Share: 0.2}, {Caller: "nightly-sync", Share: 0.3}}},
		{nil, []Reservation{{Caller: "alice@example.com", Share: 0.2}, {Caller: "nightly-sync", Share: 0.3}}},
	} {
		got, err := Build(context.Background(), st, []*keystore.Key{key("k")}, tt.caller, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tt.want, got.Keys[0].Reservations); diff != "" {
			t.Errorf("reservations for %v (-want +got):\n%s", tt.caller, diff)
		}
	}
}
