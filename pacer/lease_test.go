package pacer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// busyKey is a key far from its limits: a documented policy of q calls a
// minute, and safety limits that let a busy process lease.
func busyKey(q int64) *keystore.Key {
	k := newKey(policy("default", q, time.Minute))
	k.MaxRate, k.MaxConcurrency = 1e6, 10_000
	return k
}

// warmUp makes calls of k, 1 ms apart, each answered 200 with rd (when
// not nil), until one is admitted from a lease, and returns that one; it
// fails the test after 20 calls.
func (e *env) warmUp(p *pacer.Pacer, k *keystore.Key, rd func() *ratelimit.Reading) pacer.Ticket {
	e.t.Helper()
	for range 20 {
		t, err := e.admitWith(p, e.call(k, "sync", "/items"))
		if err != nil {
			e.t.Fatal(err)
		}
		if t.Leased() {
			return t
		}
		var r *ratelimit.Reading
		if rd != nil {
			r = rd()
		}
		answerWith(e.t, p, e.clk, t, 200, r)
		e.clk.advance(time.Millisecond)
	}
	e.t.Fatal("no call was admitted from a lease after 20 calls 1 ms apart")
	return pacer.Ticket{}
}

// countReserved returns how many of k's attempts are reserved slots.
func (e *env) countReserved(k *keystore.Key) (reserved, released int) {
	e.t.Helper()
	err := e.db.View(context.Background(), func(tx ledger.ReadTx) error {
		sends, err := tx.Sends(k.Name, time.Time{}, 1<<20)
		for _, s := range sends {
			switch s.State {
			case ledger.Reserved:
				reserved++
			case ledger.Released:
				released++
			}
		}
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return reserved, released
}

// A busy process is admitted from a lease: its slots count against the
// budget for every process from the moment they are reserved, each
// leased call is recorded with its caller, target and outcome when it
// ends, and the slots not handed out are given back.
func TestLeaseCountsForEveryProcess(t *testing.T) {
	e := newEnv(t)
	k := busyKey(100_000)
	first := e.warmUp(e.p, k, nil)
	reserved, _ := e.countReserved(k)
	if reserved < 16 {
		t.Fatalf("got %d reserved slots after the grant, want at least 16", reserved)
	}

	// Another process sees every reserved slot as sent and in flight.
	_, other := e.open()
	st, err := other.Status(context.Background(), k, "agent")
	if err != nil {
		t.Fatal(err)
	}
	var used int64
	for _, b := range st.Local {
		used = b.Used
	}
	made := int64(countAdmitted(e.activity())) + 1 // the warm-up calls and first, still reserved
	if want := made - 1 + int64(reserved); used != want {
		t.Errorf("the other process counts %d sent, want %d: %d calls recorded and %d reserved slots", used, want, made-1, reserved)
	}
	if st.InFlight != reserved {
		t.Errorf("the other process counts %d in flight, want the %d reserved slots", st.InFlight, reserved)
	}

	// Leased calls are recorded as they end.
	res := answerWith(t, e.p, e.clk, first, 200, nil)
	if res.State != ledger.Confirmed || res.Advice.Action != pacer.Continue {
		t.Errorf("a leased call's result: state %s, advice %s; want confirmed, continue", res.State, res.Advice.Action)
	}
	var found bool
	for _, a := range e.activity() {
		if a.ID == first.ID {
			found = true
			if a.Caller != "sync" || a.Target != "/items" || a.State != ledger.Confirmed || a.Status != 200 || !a.InFlightUntil.IsZero() {
				t.Errorf("the leased call is recorded as %+v, want caller sync, /items, confirmed 200, out of flight", a)
			}
		}
	}
	if !found {
		t.Error("the leased call is not in the activity")
	}

	// Closing gives back what was never handed out: the slots were the
	// latest of the log, so they go as if never reserved.
	if err := e.p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if reserved, released := e.countReserved(k); reserved != 0 || released != 0 {
		t.Errorf("after Close: %d slots still reserved and %d released, want none", reserved, released)
	}
	st, err = other.Status(context.Background(), k, "agent")
	if err != nil {
		t.Fatal(err)
	}
	if st.Local[0].Used != made || st.InFlight != 0 {
		t.Errorf("after Close the other process counts %d sent and %d in flight, want %d and 0", st.Local[0].Used, st.InFlight, made)
	}
}

func countAdmitted(list []ledger.Attempt) int {
	n := 0
	for _, a := range list {
		if a.State != ledger.RejectedLocal && a.State != ledger.Cached {
			n++
		}
	}
	return n
}

// Two processes leasing one key never admit more than its quota: each
// counts the other's reserved slots, and a lease never takes the last of
// a budget.
func TestLeasesNeverOverspend(t *testing.T) {
	const quota = 2000
	e := newEnv(t)
	k := busyKey(quota)
	_, other := e.open()
	admitted, leased := 0, 0
	open := map[*pacer.Pacer]bool{e.p: true, other: true}
	for len(open) > 0 {
		for _, p := range []*pacer.Pacer{e.p, other} {
			if !open[p] {
				continue
			}
			tk, err := e.admitWith(p, e.call(k, "sync", "/items"))
			if errors.Is(err, pacer.ErrPaused) {
				delete(open, p)
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			admitted++
			if tk.Leased() {
				leased++
			}
			answerWith(t, p, e.clk, tk, 200, nil)
			e.clk.advance(100 * time.Microsecond)
		}
	}
	if admitted > quota {
		t.Errorf("two processes admitted %d calls under a quota of %d", admitted, quota)
	}
	if leased < quota/2 {
		t.Errorf("only %d of %d calls came from leases, want most", leased, admitted)
	}
	// Slots given back when later admissions followed them stay counted:
	// that is all that may go unused.
	_, released := e.countReserved(k)
	if admitted+released != quota {
		t.Errorf("%d admitted and %d released slots, want the quota of %d between them", admitted, released, quota)
	}
	t.Logf("%d admitted (%d from leases), %d slots released unused", admitted, leased, released)
}

// An answer that is not routine ends it: the answer is advised as any
// other, the next call goes through a transaction of its own and meets
// the gate, and the slots not handed out are given back.
func TestLeaseEndsAtARefusal(t *testing.T) {
	e := newEnv(t)
	k := busyKey(100_000)
	first := e.warmUp(e.p, k, nil)
	res := answerWith(t, e.p, e.clk, first, 429, reading(30*time.Second))
	if res.Advice.Action != pacer.Pause {
		t.Errorf("advice after a 429 with Retry-After on a leased call: got %s, want pause", res.Advice.Action)
	}
	if reserved, _ := e.countReserved(k); reserved != 0 {
		t.Errorf("%d slots still reserved after the lease ended, want none", reserved)
	}
	if pe := e.mustPause(k, "sync", "/items"); pe.Source != "retry-after" {
		t.Errorf("the next call: got a pause for %s, want the Retry-After gate", pe.Source)
	}
}

// A process that dies holding a lease has spent no more than it held: its
// slots stay counted as sent, and the sweep after their lease marks them
// released.
func TestLeaseOfADeadProcess(t *testing.T) {
	e := newEnv(t)
	k := busyKey(100_000)
	e.p = pacer.New(e.rerun, pacer.WithClock(e.clk), pacer.WithInFlightTimeout(time.Minute))
	e.warmUp(e.p, k, nil) // never answered, never closed: the process "dies"
	reserved, _ := e.countReserved(k)
	if reserved == 0 {
		t.Fatal("no slot reserved")
	}
	later := e.clk.Now().Add(2 * time.Minute)
	_, err := e.db.Sweep(context.Background(), later, start.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	left, released := e.countReserved(k)
	if left != 0 || released != reserved {
		t.Errorf("after the sweep: %d reserved and %d released, want 0 and %d", left, released, reserved)
	}
	for _, a := range e.activity() {
		if a.State == ledger.Released && a.Reason.Kind != reason.Unreported {
			t.Errorf("released slot %d has the reason %+v, want %s", a.ID, a.Reason, reason.Unreported)
		}
	}
}

// A key called now and then is never leased: each call is admitted in a
// transaction of its own.
func TestNoLeaseAtAnAgentsPace(t *testing.T) {
	e := newEnv(t)
	k := busyKey(100_000)
	for range 40 {
		if tk := e.mustAdmit(k, "agent", "/items"); tk.Leased() {
			t.Fatal("a call 2 s after the last came from a lease")
		} else {
			e.answer(tk, 200, nil)
		}
		e.clk.advance(2 * time.Second)
	}
	if reserved, released := e.countReserved(k); reserved+released != 0 {
		t.Errorf("%d slots reserved at an agent's pace, want none", reserved+released)
	}
}

// A lease takes the key's pace for its slots: another process's next
// call is spaced after all of them could have gone at the key's maximum
// rate, and the holder hands them out no faster.
func TestLeaseKeepsTheMaximumRate(t *testing.T) {
	e := newEnv(t)
	k := busyKey(100_000)
	k.MaxRate = 1000 // one call a millisecond
	first := e.warmUp(e.p, k, nil)
	reserved, _ := e.countReserved(k)
	// warmUp advanced the clock 1 ms after the grant; the first slot went then.
	grantedAt := e.clk.Now().Add(-time.Millisecond)
	if !first.AdmittedAt.Equal(grantedAt) {
		t.Fatalf("the first leased call is recorded at %v, want the grant at %v", first.AdmittedAt, grantedAt)
	}
	_, other := e.open()
	pe := mustPause(t, e.clk, other, e.call(k, "agent", "/items"))
	// The granting call went at the grant and the slots may go a
	// millisecond apart after it: the last at the grant + 64 ms.
	want := grantedAt.Add(time.Duration(reserved+1) * time.Millisecond).Sub(e.clk.Now())
	if pe.Source != "pace" || pe.RetryAfter != want {
		t.Errorf("another process right after a lease of %d slots: got %s for %v, want pace for %v", reserved, pe.Source, pe.RetryAfter, want)
	}
	// The holder: not two slots in the same millisecond.
	if _, err := e.admitWith(e.p, e.call(k, "sync", "/items")); err == nil {
		t.Error("a second leased call in the same millisecond: admitted, want spaced")
	}
	e.clk.advance(time.Millisecond)
	if tk := e.mustAdmit(k, "sync", "/items"); !tk.Leased() {
		t.Error("a millisecond later: not from the lease")
	}
}

// A refusal of any call of the key ends its lease, not only of a leased
// one: here the call whose admission granted it.
func TestRefusalOfTheGrantingCallEndsTheLease(t *testing.T) {
	e := newEnv(t)
	k := busyKey(100_000)
	for range 20 {
		tk := e.mustAdmit(k, "sync", "/items")
		if tk.Leased() {
			t.Fatal("a call came from a lease before the one that granted it was found")
		}
		if reserved, _ := e.countReserved(k); reserved > 0 {
			e.answer(tk, 429, reading(30*time.Second))
			if reserved, _ := e.countReserved(k); reserved != 0 {
				t.Errorf("%d slots still reserved after the granting call's 429, want none", reserved)
			}
			e.clk.advance(time.Millisecond)
			if pe := e.mustPause(k, "sync", "/items"); pe.Source != "retry-after" {
				t.Errorf("the next call: got a pause for %s, want the Retry-After gate", pe.Source)
			}
			return
		}
		e.answer(tk, 200, nil)
		e.clk.advance(time.Millisecond)
	}
	t.Fatal("no lease was granted after 20 calls 1 ms apart")
}

// A key whose upstream policies are partitioned by route is never leased:
// a lease serves every route.
func TestNoLeaseForPartitionedPolicies(t *testing.T) {
	e := newEnv(t)
	k := busyKey(100_000)
	part := func() *ratelimit.Reading {
		ob := shown("search", 100_000, time.Hour, 90_000, time.Hour)
		ob.Partition = "items"
		return reading(0, ob)
	}
	for range 40 {
		tk := e.mustAdmit(k, "sync", "/items")
		if tk.Leased() {
			t.Fatal("a call came from a lease while the key's upstream policy is partitioned")
		}
		e.answer(tk, 200, part())
		e.clk.advance(time.Millisecond)
	}
}

// What an upstream says in answer to a leased call, or to the call whose
// admission granted the lease, is projected with every slot of the lease
// counted after it: another process never counts on a slot sent after
// the answer as if the upstream had counted it. The leased answer's observation
// reaches the file with the holder's next transaction; until then the
// granting call's observation holds.
func TestLeasedAnswerCountsTheLeasesSlots(t *testing.T) {
	e := newEnv(t)
	k := busyKey(100_000)
	up := func(r int64) *ratelimit.Reading {
		return reading(0, shown("upstream", 100_000, time.Hour, r, time.Hour))
	}
	first := e.warmUp(e.p, k, func() *ratelimit.Reading { return up(90_000) })
	n, _ := e.countReserved(k)
	reserved := int64(n)
	_, other := e.open()
	remaining := func() int64 {
		t.Helper()
		st, err := other.Status(context.Background(), k, "agent")
		if err != nil {
			t.Fatal(err)
		}
		return upstreamBudget(t, st, "upstream").Remaining
	}
	if r := remaining(); r > 90_000-reserved {
		t.Errorf("before any leased answer another process counts %d left; with the %d slots reserved after the granting call's answer saying 90000, want at most %d",
			r, reserved, 90_000-reserved)
	}
	res := answerWith(t, e.p, e.clk, first, 200, up(80_000))
	if res.Advice.Action != pacer.Continue {
		t.Fatalf("advice: %s, want continue", res.Advice.Action)
	}
	if r := remaining(); r > 90_000-reserved {
		t.Errorf("before the holder's next transaction another process counts %d left, want at most %d", r, 90_000-reserved)
	}
	if _, err := e.p.Status(context.Background(), k, "sync"); err != nil {
		t.Fatal(err)
	}
	unsent := reserved - 1
	if r := remaining(); r > 80_000-unsent {
		t.Errorf("another process counts %d left under the upstream's policy; with %d slots still to go after the answer saying 80000, want at most %d",
			r, unsent, 80_000-unsent)
	}
}
