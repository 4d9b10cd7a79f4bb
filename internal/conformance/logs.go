package conformance

import (
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
)

// logs: the sliding-window log budgets are counted from.
var logs = []behaviour{
	{"a window counts the admissions after its start, and only admissions", windowCounts},
	{"the log reads like its definition, with late admissions and sweeps", logReadsLikeItsDefinition},
	{"the log's bytes count what each admission carried, reserved slots none", bytesOfReservedSlots},
	{"an attempt reads back as it was recorded and finished", attemptLifecycle},
	{"repeats count one caller's first attempts with one digest", repeats},
	{"an attempt's state reads by its key and ID, in a write transaction too", attemptStates},
}

// An attempt's state, by its key and ID: what an outcome recorded twice is
// told apart by. Another key's ID, or none, reads as no state.
func attemptStates(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	var admitted, refused, slot int64
	update(t, s, func(tx ledger.Tx) error {
		admitted = insert(t, tx, admission("k", "agent", t0))
		refused = insert(t, tx, ledger.Attempt{CallID: "r", Attempt: 1, Key: "k", Caller: "agent", State: ledger.RejectedLocal, At: t0})
		var err error
		slot, _, err = tx.Reserve("k", 1, t0.Add(time.Second), t0.Add(time.Minute))
		return err
	}, "k")
	read := func(tx ledger.Reader) map[string]ledger.State {
		got := map[string]ledger.State{}
		for name, q := range map[string]struct {
			key string
			id  int64
		}{"admitted": {"k", admitted}, "refused": {"k", refused}, "slot": {"k", slot}, "of another key": {"other", admitted}, "none": {"k", slot + 1000}} {
			st, err := tx.AttemptState(q.key, q.id)
			if err != nil {
				t.Fatalf("AttemptState(%s %d): %v", q.key, q.id, err)
			}
			got[name] = st
		}
		return got
	}
	want := map[string]ledger.State{"admitted": ledger.Admitted, "refused": ledger.RejectedLocal, "slot": ledger.Reserved, "of another key": "", "none": ""}
	view(t, s, func(tx ledger.ReadTx) error {
		if diff := cmp.Diff(read(tx), want); diff != "" {
			t.Errorf("in a View (-got +want):\n%s", diff)
		}
		return nil
	})
	update(t, s, func(tx ledger.Tx) error {
		if err := tx.FinishAttempt(admitted, ledger.Confirmed, reason.Reason{Kind: reason.Answered, Status: 200}, 200, t0, t0.Add(time.Second)); err != nil {
			return err
		}
		want["admitted"] = ledger.Confirmed
		if diff := cmp.Diff(read(tx), want); diff != "" {
			t.Errorf("in the Update that finished it (-got +want):\n%s", diff)
		}
		return nil
	}, "k")
}

// The sliding-window log: attempts admitted after a time, counted only
// when admitted; what is in flight; the latest sends.
func windowCounts(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	update(t, s, func(tx ledger.Tx) error {
		insertNumbered(t, tx, []ledger.Attempt{
			{Caller: "agent", State: ledger.Admitted, At: t0},
			{Caller: "sync", State: ledger.Admitted, At: t0.Add(time.Second), InFlightUntil: t0.Add(time.Minute)},
			{Caller: "sync", State: ledger.RejectedLocal, At: t0.Add(2 * time.Second)}, // not counted
			{Caller: "sync", State: ledger.Admitted, At: t0.Add(3 * time.Second), InFlightUntil: t0.Add(2 * time.Second)},
			{Key: "other", Caller: "agent", State: ledger.Admitted, At: t0.Add(4 * time.Second)},
		})
		return nil
	}, "k", "other")
	view(t, s, func(tx ledger.ReadTx) error {
		w, err := tx.Window("k", t0)
		if err != nil {
			return err
		}
		want := ledger.Window{Count: 2, Oldest: t0.Add(time.Second)}
		if diff := cmp.Diff(w, want); diff != "" {
			t.Errorf("Window after t0 (-got +want):\n%s", diff)
		}
		w, err = tx.WindowByCaller("k", t0.Add(-time.Second))
		want = ledger.Window{Count: 3, Oldest: t0, ByCaller: map[string]int{"agent": 1, "sync": 2}}
		if diff := cmp.Diff(w, want); err != nil || diff != "" {
			t.Errorf("WindowByCaller (-got +want):\n%s%v", diff, err)
		}
		for _, read := range []func(string, time.Time) (ledger.Window, error){tx.Window, tx.WindowByCaller} {
			if w, err := read("k", t0.Add(time.Hour)); err != nil || w.Count != 0 || !w.Oldest.IsZero() || w.ByCaller != nil {
				t.Errorf("a window of nothing: got %+v, %v; want the zero Window", w, err)
			}
		}
		if w, err := tx.WindowOf("never", time.Time{}, []string{"agent"}); err != nil || w.Count != 0 || w.ByCaller != nil {
			t.Errorf("WindowOf a key never used: got %+v, %v; want the zero Window", w, err)
		}
		if n, err := tx.Count("k", t0.Add(-time.Second)); n != 3 || err != nil {
			t.Errorf("Count: got %d, %v; want 3", n, err)
		}
		for n, want := range map[int]time.Time{0: {}, 1: t0, 3: t0.Add(3 * time.Second), 4: {}} {
			if got, err := tx.Nth("k", t0.Add(-time.Second), n); err != nil || !got.Equal(want) {
				t.Errorf("Nth(%d) = %v, %v; want %v", n, got, err, want)
			}
		}
		if got, err := tx.Latest("k"); err != nil || !got.Equal(t0.Add(3*time.Second)) {
			t.Errorf("Latest = %v, %v; want t0+3s", got, err)
		}
		if got, err := tx.Latest("never"); err != nil || !got.IsZero() {
			t.Errorf("Latest of a key never used = %v, %v; want the zero time", got, err)
		}
		for now, want := range map[time.Time]ledger.Flight{
			t0:                       {Count: 2, Oldest: t0.Add(time.Second)},
			t0.Add(30 * time.Second): {Count: 1, Oldest: t0.Add(time.Second)},
			t0.Add(time.Hour):        {},
		} {
			got, err := tx.Flight("k", now)
			if diff := cmp.Diff(got, want); err != nil || diff != "" {
				t.Errorf("Flight at %v (-got +want):\n%s%v", now.Sub(t0), diff, err)
			}
		}
		sends, err := tx.Sends("k", time.Time{}, 2)
		if err != nil {
			return err
		}
		if len(sends) != 2 || !sends[0].At.Equal(t0.Add(time.Second)) || !sends[1].At.Equal(t0.Add(3*time.Second)) {
			t.Errorf("Sends, the latest 2: got %+v, want the sends at 1 s and 3 s, oldest first", sends)
		}
		for _, s := range sends {
			if s.State != ledger.Admitted || s.Status != 0 || !s.AnsweredAt.IsZero() {
				t.Errorf("a send in flight reads %+v, want admitted with no answer", s)
			}
		}
		return nil
	})
}

// logModel is the sliding-window log as defined: every attempt recorded,
// those admitted counted, after a time; the store's numbered log must
// answer what it answers.
type logModel struct {
	attempts []ledger.Attempt
}

func (m *logModel) record(a ledger.Attempt) { m.attempts = append(m.attempts, a) }

// sweep is what Sweep(now, before) leaves: leases that ran out by now
// end; attempts before before go, but for those still in flight.
func (m *logModel) sweep(now, before time.Time) {
	m.attempts = slices.DeleteFunc(m.attempts, func(a ledger.Attempt) bool {
		inFlight := !a.InFlightUntil.IsZero() && a.InFlightUntil.After(now)
		return a.At.Before(before) && !inFlight
	})
}

// admittedBytes returns the admission times of key after since, oldest
// first (the order of the log: by time, then as recorded), how many each
// caller made, and the bytes each carried, in the same order.
func (m *logModel) admittedBytes(key string, since time.Time) ([]time.Time, map[string]int, []int64) {
	var in []ledger.Attempt
	var by map[string]int
	for _, a := range m.attempts {
		if a.Key != key || a.State != ledger.Admitted || !a.At.After(since) {
			continue
		}
		in = append(in, a)
		if by == nil {
			by = map[string]int{}
		}
		by[a.Caller]++
	}
	slices.SortStableFunc(in, func(a, b ledger.Attempt) int { return a.At.Compare(b.At) })
	at, bytes := make([]time.Time, len(in)), make([]int64, len(in))
	for i, a := range in {
		at[i], bytes[i] = a.At, a.Bytes
	}
	return at, by, bytes
}

// checkBytes compares the bytes of key's log after since as tx reads
// them with what the admissions there carried (at, bytes: oldest first).
func checkBytes(t *testing.T, tx ledger.Reader, key string, since time.Time, at []time.Time, bytes []int64) {
	t.Helper()
	var sum int64
	for _, n := range bytes {
		sum += n
	}
	if got, err := tx.Bytes(key, since); err != nil || got != sum {
		t.Errorf("Bytes(%s, %v): got %d, %v; want %d", key, since.Sub(t0), got, err, sum)
	}
	for _, n := range []int64{1, sum / 3, sum / 2, sum, sum + 1} {
		if n < 1 {
			continue
		}
		var want time.Time
		var run int64
		for i, b := range bytes {
			if run += b; run >= n {
				want = at[i]
				break
			}
		}
		if got, err := tx.NthByte(key, since, n); err != nil || !got.Equal(want) {
			t.Errorf("NthByte(%s, %v, %d): got %v, %v; want %v", key, since.Sub(t0), n, got, err, want)
		}
	}
}

// check compares the log as s reads it with the model, for every key and
// many windows.
func (m *logModel) check(t *testing.T, s state.Store, keys, callers []string, from, to time.Time) {
	t.Helper()
	view(t, s, func(tx ledger.ReadTx) error {
		for _, key := range keys {
			for since := from.Add(-time.Second); !since.After(to); since = since.Add(2300 * time.Millisecond) {
				at, by, bytes := m.admittedBytes(key, since)
				checkBytes(t, tx, key, since, at, bytes)
				want := ledger.Window{Count: len(at)}
				if len(at) > 0 {
					want.Oldest = at[0]
				}
				got, err := tx.Window(key, since)
				if err != nil {
					return err
				}
				if got.Count != want.Count || !got.Oldest.Equal(want.Oldest) {
					t.Errorf("Window(%s, %v): got %d from %v, want %d from %v", key, since.Sub(from), got.Count, got.Oldest, want.Count, want.Oldest)
				}
				of, err := tx.WindowOf(key, since, append(slices.Clone(callers), "nobody"))
				if err != nil || of.Count != want.Count || !maps.Equal(of.ByCaller, by) {
					t.Errorf("WindowOf(%s, %v): got %d, %v, %v; want %d, %v", key, since.Sub(from), of.Count, of.ByCaller, err, want.Count, by)
				}
				all, err := tx.WindowByCaller(key, since)
				if err != nil || all.Count != want.Count || !maps.Equal(all.ByCaller, by) {
					t.Errorf("WindowByCaller(%s, %v): got %d, %v, %v; want %d, %v", key, since.Sub(from), all.Count, all.ByCaller, err, want.Count, by)
				}
				if n, err := tx.Count(key, since); err != nil || n != want.Count {
					t.Errorf("Count(%s, %v): got %d, %v; want %d", key, since.Sub(from), n, err, want.Count)
				}
				for _, n := range []int{1, 2, len(at) / 2, len(at), len(at) + 1} {
					if n < 1 {
						continue
					}
					var want time.Time
					if n <= len(at) {
						want = at[n-1]
					}
					if got, err := tx.Nth(key, since, n); err != nil || !got.Equal(want) {
						t.Errorf("Nth(%s, %v, %d): got %v, %v; want %v", key, since.Sub(from), n, got, err, want)
					}
				}
				sends, err := tx.Sends(key, since, 1<<20)
				if err != nil || len(sends) != len(at) {
					t.Errorf("Sends(%s, %v): got %d, %v; want %d", key, since.Sub(from), len(sends), err, len(at))
				}
			}
		}
		return nil
	})
}

// The log read by the attempts' numbers says what the log's definition
// says: with several keys, attempts that do not count, admissions
// recorded out of order (numbered again), ties, and sweeps that keep
// attempts still in flight (numbered again too).
func logReadsLikeItsDefinition(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	var m logModel
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []string{"a", "b", "c"}
	callers := []string{"agent", "sync", "x"}
	states := []ledger.State{ledger.Admitted, ledger.Admitted, ledger.Admitted, ledger.RejectedLocal, ledger.Cached}
	now := t0
	for round := range 4 {
		batch := make([]ledger.Attempt, 60) // drawn once: the function may run twice
		for i := range batch {
			now = now.Add(time.Duration(rng.IntN(400)) * time.Millisecond) // ties too
			a := ledger.Attempt{CallID: "c", Attempt: 1, Key: keys[rng.IntN(len(keys))], Caller: callers[rng.IntN(len(callers))],
				State: states[rng.IntN(len(states))], At: now, CallerReserves: true, Bytes: int64(rng.IntN(3) * rng.IntN(2000))}
			if rng.IntN(10) == 0 {
				a.At = now.Add(-time.Duration(rng.IntN(5000)) * time.Millisecond) // recorded late
			}
			if a.State == ledger.Admitted && rng.IntN(4) == 0 {
				a.InFlightUntil = now.Add(time.Duration(rng.IntN(20)) * time.Second)
			}
			batch[i] = a
		}
		update(t, s, func(tx ledger.Tx) error {
			for _, a := range batch {
				insert(t, tx, a)
			}
			return nil
		}, keys...)
		for _, a := range batch {
			m.record(a)
		}
		m.check(t, s, keys, callers, t0, now)
		if round%2 == 1 {
			before := t0.Add(now.Sub(t0) / 2)
			sweep(t, s, before, before)
			m.sweep(before, before)
			m.check(t, s, keys, callers, t0, now)
		}
	}
}

// Reserved slots carry no bytes the log knows of: the bytes of the
// admissions around them are counted as carried, whether the slots are
// kept (released) or deleted.
func bytesOfReservedSlots(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	carried := func(at time.Time, n int64) ledger.Attempt {
		a := admission("k", "sync", at)
		a.Bytes = n
		return a
	}
	update(t, s, func(tx ledger.Tx) error {
		insert(t, tx, carried(t0, 100))
		first, last, err := tx.Reserve("k", 3, t0.Add(time.Millisecond), t0.Add(time.Minute))
		if err != nil {
			return err
		}
		insert(t, tx, carried(t0.Add(2*time.Millisecond), 50))
		checkBytes(t, tx, "k", t0.Add(-time.Second), []time.Time{t0, t0.Add(2 * time.Millisecond)}, []int64{100, 50})
		checkBytes(t, tx, "k", t0, []time.Time{t0.Add(2 * time.Millisecond)}, []int64{50})
		if err := tx.Release("k", first, last); err != nil {
			return err
		}
		first, last, err = tx.Reserve("k", 2, t0.Add(3*time.Millisecond), t0.Add(time.Minute))
		if err != nil {
			return err
		}
		if err := tx.Release("k", first, last); err != nil { // the log's last: deleted
			return err
		}
		insert(t, tx, carried(t0.Add(4*time.Millisecond), 7))
		return nil
	}, "k")
	view(t, s, func(tx ledger.ReadTx) error {
		checkBytes(t, tx, "k", t0.Add(-time.Second), []time.Time{t0, t0.Add(2 * time.Millisecond), t0.Add(4 * time.Millisecond)},
			[]int64{100, 50, 7})
		checkBytes(t, tx, "k", t0.Add(time.Hour), nil, nil)
		checkBytes(t, tx, "never", time.Time{}, nil, nil)
		return nil
	})
}

// An attempt reads back, in the activity and as its call, with every
// field it was recorded and finished with; a finished attempt is no
// longer in flight.
func attemptLifecycle(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	var id int64
	update(t, s, func(tx ledger.Tx) error {
		id = insert(t, tx, ledger.Attempt{CallID: "c1", Attempt: 1, Key: "k", Caller: "agent", Transport: "stdio",
			Method: "GET", Target: "/items?q=1", Digest: "d", State: ledger.Admitted, Probe: true, At: t0,
			Wait: 1500 * time.Millisecond, InFlightUntil: t0.Add(time.Minute)})
		if f, err := tx.Flight("k", t0); err != nil || f.Count != 1 {
			t.Errorf("Flight before the attempt finished: got %+v, %v; want 1", f, err)
		}
		return tx.FinishAttempt(id, ledger.Confirmed, reason.Reason{Kind: reason.Answered, Status: 200}, 200, t0.Add(time.Millisecond), t0.Add(time.Second))
	}, "k")
	view(t, s, func(tx ledger.ReadTx) error {
		want := []ledger.Attempt{{ID: id, CallID: "c1", Attempt: 1, Key: "k", Caller: "agent", Transport: "stdio",
			Method: "GET", Target: "/items?q=1", Digest: "d", State: ledger.Confirmed, Reason: reason.Reason{Kind: reason.Answered, Status: 200}, Probe: true,
			At: t0, Wait: 1500 * time.Millisecond, SentAt: t0.Add(time.Millisecond), AnsweredAt: t0.Add(time.Second), Status: 200}}
		ignoreInstance := cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Instance" }, cmp.Ignore())
		list, err := tx.Activity(ledger.ActivityFilter{Key: "k"})
		if diff := cmp.Diff(list, want, ignoreInstance); diff != "" {
			t.Errorf("Activity (-got +want):\n%s", diff)
		}
		call, err2 := tx.Call("k", "c1")
		if diff := cmp.Diff(call, want, ignoreInstance); diff != "" {
			t.Errorf("Call (-got +want):\n%s", diff)
		}
		if f, err := tx.Flight("k", t0); err != nil || f.Count != 0 {
			t.Errorf("Flight after the attempt finished: got %+v, %v; want nothing", f, err)
		}
		sends, err3 := tx.Sends("k", time.Time{}, 10)
		wantSends := []ledger.Send{{ID: id, At: t0, State: ledger.Confirmed, Status: 200, AnsweredAt: t0.Add(time.Second)}}
		if diff := cmp.Diff(sends, wantSends); diff != "" {
			t.Errorf("Sends (-got +want):\n%s", diff)
		}
		return errors.Join(err, err2, err3)
	})
}

// The loop guard's count: first attempts of one caller with one digest,
// sent, refused or answered from the cache; not retries, not another
// caller's, not an empty digest.
func repeats(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	update(t, s, func(tx ledger.Tx) error {
		for i, a := range []ledger.Attempt{
			{Caller: "agent", Digest: "d", State: ledger.Admitted, Attempt: 1, At: t0},
			{Caller: "agent", Digest: "d", State: ledger.Admitted, Attempt: 2, At: t0.Add(time.Second)}, // a retry
			{Caller: "agent", Digest: "d", State: ledger.RejectedLocal, Attempt: 1, At: t0.Add(2 * time.Second)},
			{Caller: "agent", Digest: "d", State: ledger.Cached, Attempt: 1, At: t0.Add(3 * time.Second)},
			{Caller: "agent", Digest: "e", State: ledger.Admitted, Attempt: 1, At: t0.Add(4 * time.Second)},
			{Caller: "sync", Digest: "d", State: ledger.Admitted, Attempt: 1, At: t0.Add(5 * time.Second)},
			{Caller: "agent", Digest: "", State: ledger.Admitted, Attempt: 1, At: t0.Add(6 * time.Second)},
		} {
			a.Key, a.CallID = "k", string(rune('a'+i))
			insert(t, tx, a)
		}
		return nil
	}, "k")
	view(t, s, func(tx ledger.ReadTx) error {
		for _, c := range []struct {
			caller, digest string
			since          time.Time
			want           int
		}{
			{"agent", "d", t0.Add(-time.Second), 3},
			{"agent", "d", t0, 2}, // after since
			{"agent", "e", t0.Add(-time.Second), 1},
			{"sync", "d", t0.Add(-time.Second), 1},
			{"agent", "", t0.Add(-time.Second), 0},
			{"nobody", "d", t0.Add(-time.Second), 0},
		} {
			if n, err := tx.Repeats("k", c.caller, c.digest, c.since); n != c.want || err != nil {
				t.Errorf("Repeats(%s, %q, %v): got %d, %v; want %d", c.caller, c.digest, c.since.Sub(t0), n, err, c.want)
			}
		}
		return nil
	})
}
