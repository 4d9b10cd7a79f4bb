package pacer

import (
	"slices"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// The fair rule at fixed instants: t0 is when the window's first call
// went, now a while later; the window's counts per principal are given.
var (
	ft0  = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	fnow = ft0.Add(20 * time.Second)
)

func fairKey(shares ...keystore.Share) *keystore.Key {
	return &keystore.Key{Name: "k", Shares: shares}
}

// win is a window of policy "default", 30 calls per 60 s with a margin
// of 1 s, of which used calls (by the principals, each of whose oldest
// call went at t0) are spent.
func win(used map[string]int) fairWindow {
	w := fairWindow{policy: "default", limit: 30, window: time.Minute, margin: time.Second, use: map[string]ledger.Use{}}
	var n int
	for p, c := range used {
		if c > 0 {
			w.use[p] = ledger.Use{Count: c, Oldest: ft0}
		}
		n += c
	}
	w.avail = w.limit - int64(n)
	return w
}

func TestFairRule(t *testing.T) {
	everyone40 := fairKey(keystore.Share{Principal: "*", Share: 0.4})
	weighted := fairKey(keystore.Share{Principal: "alice", Share: 0.2}, keystore.Share{Principal: "sync", Share: 0.6})
	tests := []struct {
		name      string
		key       *keystore.Key
		principal string
		waiting   []string
		used      map[string]int
		wantWait  time.Duration // 0: admitted
		source    string
	}{
		{name: "under its cap", key: everyone40, principal: "sync", used: map[string]int{"sync": 11}},
		// 40% of 30 is 12: the 13th waits until the oldest of its 12
		// leaves the window (t0 + 60 s + the margin).
		{name: "at its cap", key: everyone40, principal: "sync", used: map[string]int{"sync": 12},
			wantWait: 41 * time.Second, source: SourceShare},
		{name: "a share too small for one call still allows one", principal: "bob",
			key: fairKey(keystore.Share{Principal: "bob", Share: 0.01}), used: map[string]int{}},
		{name: "a share too small for one call allows only one", principal: "bob",
			key: fairKey(keystore.Share{Principal: "bob", Share: 0.01}), used: map[string]int{"bob": 1},
			wantWait: 41 * time.Second, source: SourceShare},
		{name: "a principal without an entry is not capped", principal: "carol",
			key: fairKey(keystore.Share{Principal: "bob", Share: 0.2}), used: map[string]int{"carol": 29}},
		{name: "alone, no turns", key: everyone40, principal: "sync", waiting: []string{"sync"}, used: map[string]int{"sync": 5}},
		// Both waiting, 30 calls: each is owed its half. sync (8) is ahead
		// of alice (1), who is owed 14 more: 21 left covers her turns.
		{name: "enough left for the one behind", key: fairKey(keystore.Share{Principal: "*", Share: 1}), principal: "sync",
			waiting: []string{"alice", "sync"}, used: map[string]int{"alice": 1, "sync": 8}},
		// 14 left no longer does: the next calls are alice's.
		{name: "not its turn", key: fairKey(keystore.Share{Principal: "*", Share: 1}), principal: "sync",
			waiting: []string{"alice", "sync"}, used: map[string]int{"alice": 1, "sync": 15},
			wantWait: Poll, source: SourceTurn},
		{name: "the one behind goes", key: fairKey(keystore.Share{Principal: "*", Share: 1}), principal: "alice",
			waiting: []string{"alice", "sync"}, used: map[string]int{"alice": 1, "sync": 15}},
		{name: "a tie goes", key: fairKey(keystore.Share{Principal: "*", Share: 1}), principal: "sync",
			waiting: []string{"alice", "sync"}, used: map[string]int{"alice": 14, "sync": 14}},
		// By shares: sync's 5 of 0.6 (8.3 a share) are behind alice's 2
		// of 0.2 (10 a share), though they are more calls.
		{name: "weighted: more calls, yet behind", key: weighted, principal: "sync",
			waiting: []string{"alice", "sync"}, used: map[string]int{"alice": 2, "sync": 5}},
		// The 3 calls left are fewer than sync, further behind, is still
		// owed of its part (22 of 30 by the shares of those waiting).
		{name: "weighted: ahead waits", key: weighted, principal: "alice",
			waiting: []string{"alice", "sync"}, used: map[string]int{"alice": 2, "sync": 5, "other": 20},
			wantWait: Poll, source: SourceTurn},
		// A principal that waits at its cap takes no turn: it holds no one.
		{name: "a capped waiter holds no one", key: everyone40, principal: "sync",
			waiting: []string{"alice", "sync"}, used: map[string]int{"alice": 12, "sync": 11, "other": 5}},
		// Another principal waiting on another host counts the same: the
		// waiting list is the state's, across hosts.
		{name: "one call waiting is not starved by many", key: fairKey(keystore.Share{Principal: "*", Share: 1}), principal: "sync",
			waiting: []string{"bob", "sync"}, used: map[string]int{"sync": 27},
			wantWait: Poll, source: SourceTurn},
		// The key's own budget is spent: every principal waits for it
		// alike, and the rule adds nothing.
		{name: "the key's budget binds", key: fairKey(keystore.Share{Principal: "*", Share: 1}), principal: "sync",
			waiting: []string{"bob", "sync"}, used: map[string]int{"sync": 30}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, ok := fairRule(fnow, tt.key, tt.principal, tt.waiting, win(tt.used))
			if !ok {
				if tt.wantWait != 0 {
					t.Fatalf("got admitted, want a wait of %v (%s)", tt.wantWait, tt.source)
				}
				return
			}
			if tt.wantWait == 0 {
				t.Fatalf("got a wait of %v (%s: %s), want admitted", c.wait, c.source, c.reason)
			}
			if c.wait != tt.wantWait || c.source != tt.source {
				t.Errorf("got a wait of %v (%s), want %v (%s)", c.wait, c.source, tt.wantWait, tt.source)
			}
			if c.reason.Principal != tt.principal {
				t.Errorf("reason %+v is not about the principal %q", c.reason, tt.principal)
			}
		})
	}
}

// The reason for a spent share says whose share, how much of which
// policy, and that the key itself is not spent.
func TestFairRuleSaysWhichShare(t *testing.T) {
	k := fairKey(keystore.Share{Principal: "sync", Share: 0.4})
	c, _, ok := fairRule(fnow, k, "sync", nil, win(map[string]int{"sync": 12, "alice": 3}))
	if !ok {
		t.Fatal("got admitted, want a wait for the share")
	}
	want := reason.Reason{Kind: reason.ShareSpent, Principal: "sync", Share: 0.4, Used: 12, Limit: 30, Window: time.Minute,
		Policy: "default", Left: 15}
	if c.reason != want {
		t.Errorf("got reason\n%+v\nwant\n%+v", c.reason, want)
	}
	if !c.exhaust || c.keyWide {
		t.Errorf("got exhaust %v keyWide %v, want a spent budget of the principal alone", c.exhaust, c.keyWide)
	}
}

// A window's calls, freed one at a time, go to the principals waiting for
// them by the rule, whoever asks first: a sync job with a hundred calls
// waiting asks before each of two agents with one call each, and each
// principal still gets its part — a third each, or by shares.
func TestFairRuleSharesAWindow(t *testing.T) {
	tests := []struct {
		name string
		key  *keystore.Key
		want map[string]int
		left int // calls no one may take: every waiting principal is at its cap
	}{
		{"equal", fairKey(keystore.Share{Principal: "*", Share: 1}), map[string]int{"sync": 10, "alice": 10, "bob": 10}, 0},
		{"capped", fairKey(keystore.Share{Principal: "*", Share: 0.4}), map[string]int{"sync": 10, "alice": 10, "bob": 10}, 0},
		// 7.5 calls are 7 for a cap: the last call of the window is
		// no one's.
		{"weighted", fairKey(keystore.Share{Principal: "sync", Share: 0.5}, keystore.Share{Principal: "*", Share: 0.25}),
			map[string]int{"sync": 15, "alice": 7, "bob": 7}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// In the order they ask: every one of sync's calls first.
			var asking []string
			for range 100 {
				asking = append(asking, "sync")
			}
			asking = append(asking, "alice", "bob")
			waiting := []string{"alice", "bob", "sync"}
			used := map[string]int{}
			for slot := range 30 - tt.left {
				w := win(used)
				i := slices.IndexFunc(asking, func(p string) bool {
					_, _, wait := fairRule(fnow, tt.key, p, waiting, w)
					return !wait
				})
				if i < 0 {
					t.Fatalf("slot %d: no one may take it (used %v)", slot, used)
				}
				used[asking[i]]++
			}
			w := win(used)
			for _, p := range asking {
				if _, _, wait := fairRule(fnow, tt.key, p, waiting, w); !wait && tt.left > 0 {
					t.Fatalf("%s may take a call every principal's cap should keep (used %v)", p, used)
				}
			}
			for p, n := range tt.want {
				if used[p] != n {
					t.Errorf("got %v, want %v", used, tt.want)
					break
				}
			}
		})
	}
}

// Through the snapshot, on a fake log at fixed instants: a call held for
// another principal's turn re-checks when enough of the window's calls
// have left it for the turns before its own — not every Poll — and the
// one behind goes at once.
func TestFairConstraintsOnALog(t *testing.T) {
	k := fairKey(keystore.Share{Principal: "*", Share: 1})
	k.Policies = []keystore.Policy{{Name: "default", Quota: 4, Window: time.Minute}}
	l := fakeLog{{at: ft0, by: "sync"}, {at: ft0.Add(time.Second), by: "sync"}, {at: ft0.Add(2 * time.Second), by: "sync"}}
	snap := func(principal string) snapshot {
		return snapshot{now: ft0.Add(10 * time.Second), key: k, log: l,
			fair: &fairView{principal: principal, waiting: []string{"alice", "sync"}, log: l}}
	}
	windows, err := snap("sync").windowedBudgets()
	if err != nil || len(windows) != 1 || windows[0].avail != 1 {
		t.Fatalf("windowed budgets: %+v, %v; want one with 1 call left", windows, err)
	}
	// sync has 3 of 4, alice, waiting, none: she is owed 2 (half of 4),
	// more than the 1 left, so sync's turn comes once 2 more of the
	// window's calls have left it: the second, at t0+1s, leaves at t0+61s.
	cs, err := snap("sync").fairConstraints(windows)
	if err != nil || len(cs) != 1 {
		t.Fatalf("sync: got %+v, %v; want one wait", cs, err)
	}
	if c := cs[0]; c.source != SourceTurn || c.wait != 51*time.Second || c.poll {
		t.Errorf("sync: got a wait of %v (%s, poll %v); want 51 s for its turn, a known end", c.wait, c.source, c.poll)
	}
	if cs, err := snap("alice").fairConstraints(windows); err != nil || len(cs) != 0 {
		t.Errorf("alice: got %+v, %v; want no wait", cs, err)
	}
	d, err := decide(snap("sync"))
	if err != nil || d.admit || d.source != SourceTurn {
		t.Errorf("decide for sync: got admit %v source %q, %v; want it held for alice's turn", d.admit, d.source, err)
	}
	if d, err := decide(snap("alice")); err != nil || !d.admit {
		t.Errorf("decide for alice: got admit %v (%s: %s), %v; want admitted", d.admit, d.source, d.reason, err)
	}
}

// A share's cap is the whole calls of its part of the quota, at least
// one: a part that floating point puts a hair below a whole number (0.29
// of 100 is 28.999999999999996) is that whole number.
func TestShareCap(t *testing.T) {
	for _, tt := range []struct {
		share float64
		q     int64
		want  int64
	}{
		{0.4, 30, 12},
		{0.29, 100, 29},
		{0.57, 100, 57},
		{0.45, 30, 13},
		{0.01, 30, 1},
		{1, 30, 30},
	} {
		if got := shareCap(tt.share, tt.q); got != tt.want {
			t.Errorf("shareCap(%v, %d) = %d, want %d", tt.share, tt.q, got, tt.want)
		}
	}
}
