package pacer

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

var b0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// word is a policy the upstream showed at b0: q per w, r left for t.
func kept(name string, unit ratelimit.Unit, q int64, w time.Duration, r int64, t time.Duration) ledger.SeenPolicy {
	k := ledger.SeenPolicy{Key: "k", ReceivedAt: b0, BasisAt: b0,
		Observation: ratelimit.Observation{Policy: name, Unit: unit, Quota: q, HasQuota: q > 0, Window: w}}
	if t > 0 {
		k.Remaining, k.HasRemaining, k.Reset, k.HasReset = r, true, t, true
	}
	return k
}

// What goes first past a bound: what constrains nothing, then what only
// spreads calls, then the most headroom (a quota with no observation of what is
// left counts as all of it), then the oldest observation.
func TestEvictions(t *testing.T) {
	now := b0.Add(time.Minute)
	expired := kept("expired", ratelimit.Requests, 0, 0, 0, 10*time.Second)      // r=0 but expired and answered since
	tokens := kept("tokens", ratelimit.Tokens, 0, 0, 5000, time.Hour)            // not exhausted: spreads only
	roomy := kept("roomy", ratelimit.Requests, 100, time.Hour, 90, time.Hour)    // 90 % left
	tight := kept("tight", ratelimit.Requests, 100, time.Hour, 1, time.Hour)     // 1 % left
	spent := kept("spent", ratelimit.Tokens, 0, 0, 0, time.Hour)                 // exhausted, in a unit the log does not count
	older := kept("older", ratelimit.Requests, 100, time.Hour, 90, time.Hour)    // as roomy, said earlier
	older.ReceivedAt, older.BasisAt = b0.Add(-time.Second), b0.Add(-time.Second) //
	conc := kept("conc", ratelimit.ConcurrentRequests, 4, 0, 0, 0)               // a limit in flight binds
	rows := []ledger.SeenPolicy{tight, conc, spent, roomy, tokens, expired, older}
	for _, tt := range []struct {
		keep int
		want []string
	}{
		{7, nil},
		{6, []string{"expired"}},
		{5, []string{"expired", "tokens"}},
		{3, []string{"expired", "tokens", "conc", "older"}},
		{0, []string{"expired", "tokens", "conc", "older", "roomy", "tight", "spent"}},
	} {
		var got []string
		for _, k := range evictions(rows, tt.keep, now, now) {
			got = append(got, k.Policy)
		}
		if diff := cmp.Diff(got, tt.want); diff != "" {
			t.Errorf("keep %d (-got +want):\n%s", tt.keep, diff)
		}
	}
	// Expired but never answered since: a probe is due, so it is not
	// nothing.
	if r := restraintOf(expired, now, b0); r.class != 1 {
		t.Errorf("an expired word unanswered since: class %d, want 1", r.class)
	}
}

// A fold is at least as tight as each policy folded into it.
func TestFold(t *testing.T) {
	now := b0.Add(10 * time.Second)
	sent := map[time.Time]int64{b0: 3, now: 0, b0.Add(5 * time.Second): 1}
	count := func(since time.Time) (int64, error) { return sent[since], nil }
	later := kept("later", ratelimit.Requests, 0, 0, 2, 2*time.Minute)
	later.ReceivedAt, later.BasisAt = b0.Add(5*time.Second), b0.Add(5*time.Second)
	for _, tt := range []struct {
		name   string
		into   ledger.SeenPolicy
		folded []ledger.SeenPolicy
		want   ratelimit.Observation
	}{
		{"a window: the least quota over the longest window",
			ledger.SeenPolicy{}, []ledger.SeenPolicy{kept("a", ratelimit.Requests, 100, time.Minute, 0, 0), kept("b", ratelimit.Requests, 5000, time.Hour, 0, 0)},
			ratelimit.Observation{Quota: 100, HasQuota: true, Window: time.Hour}},
		{"a live word: what is left now, sends subtracted, until the latest end",
			ledger.SeenPolicy{}, []ledger.SeenPolicy{kept("a", ratelimit.Requests, 0, 0, 10, time.Minute), later},
			ratelimit.Observation{Remaining: 1, HasRemaining: true, Reset: 2*time.Minute - 5*time.Second, HasReset: true}},
		{"an expired word: nothing",
			ledger.SeenPolicy{}, []ledger.SeenPolicy{kept("a", ratelimit.Requests, 0, 0, 0, 5*time.Second)},
			ratelimit.Observation{}},
		{"an exhausted word in tokens: nothing left in requests",
			ledger.SeenPolicy{}, []ledger.SeenPolicy{kept("a", ratelimit.Tokens, 0, 0, 0, time.Minute)},
			ratelimit.Observation{Remaining: 0, HasRemaining: true, Reset: 50 * time.Second, HasReset: true}},
		{"tokens left: nothing held back",
			ledger.SeenPolicy{}, []ledger.SeenPolicy{kept("a", ratelimit.Tokens, 0, 0, 900, time.Minute)},
			ratelimit.Observation{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.into
			for _, v := range tt.folded {
				var err error
				if c, err = fold(c, v, now, count); err != nil {
					t.Fatal(err)
				}
			}
			want := tt.want
			want.Policy, want.Unit, want.Shape = EvictedPolicy, ratelimit.Requests, shapeFolded
			if diff := cmp.Diff(c.Observation, want); diff != "" {
				t.Errorf("folded (-got +want):\n%s", diff)
			}
		})
	}
	// Folding into a fold keeps the earlier fold's observation, its own sends
	// subtracted.
	none := func(time.Time) (int64, error) { return 0, nil }
	first, _ := fold(ledger.SeenPolicy{}, kept("a", ratelimit.Requests, 0, 0, 4, time.Minute), b0, none) // 4 left at b0, basis b0
	got, _ := fold(first, kept("b", ratelimit.Requests, 0, 0, 50, 10*time.Minute), now, count)
	if got.Remaining != 1 || got.Reset != 10*time.Minute-10*time.Second {
		t.Errorf("a fold into a fold: r=%d t=%s, want r=1 (4 less 3 sent) t=9m50s", got.Remaining, got.Reset)
	}
	conc, _ := fold(ledger.SeenPolicy{}, kept("c", ratelimit.ConcurrentRequests, 8, 0, 0, 0), now, count)
	conc, _ = fold(conc, kept("d", ratelimit.ConcurrentRequests, 3, 0, 0, 0), now, count)
	if conc.Unit != ratelimit.ConcurrentRequests || conc.Quota != 3 {
		t.Errorf("limits in flight folded: %s q=%d, want concurrent-requests q=3", conc.Unit, conc.Quota)
	}
}

// A long name is cut to MaxName bytes, valid UTF-8, and two long names
// that differ past the cut stay two.
func TestBoundName(t *testing.T) {
	long := strings.Repeat("é", 200)
	a, b := boundName(long+"a"), boundName(long+"b")
	if len(a) > MaxName || !utf8.ValidString(a) {
		t.Errorf("bound name: %d bytes, valid %v; want at most %d, valid", len(a), utf8.ValidString(a), MaxName)
	}
	if a == b {
		t.Errorf("two long names bound to the same %q", a)
	}
	if got := boundName("core"); got != "core" {
		t.Errorf("a short name: got %q, want it as it is", got)
	}
}

// A long name whose cut part holds a credential split by an invalid byte
// (an upstream slipping it past the scrubber) keeps it split.
func TestBoundNameKeepsWhatInvalidBytesSplitApart(t *testing.T) {
	const credential = "a-credential-of-forty-characters-0123456"
	got := boundName("x" + credential[:10] + "\xff" + credential[10:] + strings.Repeat("p", 200))
	if strings.Contains(got, credential) || len(got) > MaxName || !utf8.ValidString(got) {
		t.Errorf("bound name %q: joins the credential, or is longer than %d or not valid UTF-8", got, MaxName)
	}
}
