package state_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/state"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func open(t *testing.T, path string) *state.DB {
	t.Helper()
	db, err := state.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func newDB(t *testing.T) *state.DB {
	return open(t, filepath.Join(t.TempDir(), "sub", "state.db"))
}

func update(t *testing.T, db *state.DB, fn func(ledger.Tx) error) {
	t.Helper()
	if err := db.Update(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}

func sweep(t *testing.T, db *state.DB, now, before time.Time) state.Swept {
	t.Helper()
	n, err := db.Sweep(context.Background(), now, before)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func view(t *testing.T, db *state.DB, fn func(ledger.Tx) error) {
	t.Helper()
	if err := db.View(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}

func TestOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b", "state.db")
	db := open(t, path)
	if db.Path() != path {
		t.Errorf("Path() = %q, want %q", db.Path(), path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode: got %v, want 0600", fi.Mode().Perm())
	}
	update(t, db, func(tx ledger.Tx) error {
		_, err := tx.InsertAttempt(ledger.Attempt{CallID: "c", Attempt: 1, Key: "k", State: ledger.Admitted, At: t0})
		return err
	})
	// Opened again (another process): the schema is not applied twice and
	// what was written is there.
	other := open(t, path)
	view(t, other, func(tx ledger.Tx) error {
		n, err := tx.Count("k", time.Time{})
		if n != 1 {
			t.Errorf("count in the file opened again: got %d, want 1", n)
		}
		return err
	})
	if problems, err := other.IntegrityCheck(context.Background()); err != nil || len(problems) > 0 {
		t.Errorf("IntegrityCheck: %v %q", err, problems)
	}
}

// The sliding-window log: attempts admitted after a time, counted only
// when admitted.
func TestLog(t *testing.T) {
	db := newDB(t)
	update(t, db, func(tx ledger.Tx) error {
		for i, a := range []ledger.Attempt{
			{Caller: "agent", State: ledger.Admitted, At: t0},
			{Caller: "sync", State: ledger.Admitted, At: t0.Add(time.Second), LeaseUntil: t0.Add(time.Minute)},
			{Caller: "sync", State: ledger.RejectedLocal, At: t0.Add(2 * time.Second)}, // not counted
			{Caller: "sync", State: ledger.Admitted, At: t0.Add(3 * time.Second), LeaseUntil: t0.Add(2 * time.Second)},
			{Key: "other", Caller: "agent", State: ledger.Admitted, At: t0.Add(4 * time.Second)},
		} {
			a.CallID, a.Attempt = "c", i+1
			if a.Key == "" {
				a.Key = "k"
			}
			if _, err := tx.InsertAttempt(a); err != nil {
				return err
			}
		}
		return nil
	})
	view(t, db, func(tx ledger.Tx) error {
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
			if w, _ := read("k", t0.Add(time.Hour)); w.Count != 0 || !w.Oldest.IsZero() || w.ByCaller != nil {
				t.Errorf("a window of nothing: got %+v, want the zero Window", w)
			}
		}
		if n, _ := tx.Count("k", t0.Add(-time.Second)); n != 3 {
			t.Errorf("Count: got %d, want 3", n)
		}
		if n, _ := tx.CountBy("k", "sync", t0.Add(-time.Second)); n != 2 {
			t.Errorf("CountBy: got %d, want 2", n)
		}
		for n, want := range map[int]time.Time{1: t0, 3: t0.Add(3 * time.Second), 4: {}} {
			if got, _ := tx.Nth("k", t0.Add(-time.Second), n); !got.Equal(want) {
				t.Errorf("Nth(%d) = %v, want %v", n, got, want)
			}
		}
		if got, _ := tx.Latest("k"); !got.Equal(t0.Add(3 * time.Second)) {
			t.Errorf("Latest = %v, want t0+3s", got)
		}
		if n, _ := tx.InFlight("k", t0.Add(30*time.Second)); n != 1 {
			t.Errorf("InFlight: got %d, want 1 (the other lease ran out)", n)
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
		return nil
	})
}

func TestAttemptLifecycle(t *testing.T) {
	db := newDB(t)
	var id int64
	update(t, db, func(tx ledger.Tx) error {
		var err error
		id, err = tx.InsertAttempt(ledger.Attempt{CallID: "c1", Attempt: 1, Key: "k", Caller: "agent", Transport: "stdio",
			Method: "GET", Target: "/items", Digest: "d", State: ledger.Admitted, Probe: true, At: t0,
			Wait: 1500 * time.Millisecond, LeaseUntil: t0.Add(time.Minute)})
		if err != nil {
			return err
		}
		return tx.FinishAttempt(id, ledger.Confirmed, "HTTP 200 OK", 200, t0.Add(time.Millisecond), t0.Add(time.Second))
	})
	view(t, db, func(tx ledger.Tx) error {
		list, err := tx.Activity(ledger.ActivityFilter{Key: "k"})
		want := []ledger.Attempt{{ID: id, CallID: "c1", Attempt: 1, Key: "k", Caller: "agent", Transport: "stdio",
			Method: "GET", Target: "/items", Digest: "d", State: ledger.Confirmed, Reason: "HTTP 200 OK", Probe: true,
			At: t0, Wait: 1500 * time.Millisecond, SentAt: t0.Add(time.Millisecond), AnsweredAt: t0.Add(time.Second), Status: 200,
			Instance: state.Instance()}}
		if diff := cmp.Diff(list, want); diff != "" {
			t.Errorf("Activity (-got +want):\n%s", diff)
		}
		if n, err := tx.Repeats("k", "agent", "d", t0.Add(-time.Second)); n != 1 || err != nil {
			t.Errorf("Repeats: got %d, %v, want 1", n, err)
		}
		if n, err := tx.Repeats("k", "sync", "d", t0.Add(-time.Second)); n != 0 || err != nil {
			t.Errorf("Repeats of another caller: got %d, %v, want 0", n, err)
		}
		return err
	})
}

func TestActivityPages(t *testing.T) {
	db := newDB(t)
	update(t, db, func(tx ledger.Tx) error {
		for i := range 5 {
			key := "a"
			if i%2 == 1 {
				key = "b"
			}
			if _, err := tx.InsertAttempt(ledger.Attempt{CallID: "c", Key: key, State: ledger.RejectedLocal, At: t0.Add(time.Duration(i) * time.Second)}); err != nil {
				return err
			}
		}
		return nil
	})
	view(t, db, func(tx ledger.Tx) error {
		page, err := tx.Activity(ledger.ActivityFilter{Limit: 2})
		if err != nil || len(page) != 2 || page[0].ID != 5 || page[1].ID != 4 {
			t.Errorf("first page: got %+v, %v; want 5 and 4", page, err)
		}
		page, _ = tx.Activity(ledger.ActivityFilter{Before: 4, Limit: 2})
		if len(page) != 2 || page[0].ID != 3 {
			t.Errorf("next page: got %+v, want 3 and 2", page)
		}
		page, _ = tx.Activity(ledger.ActivityFilter{Key: "a", Since: t0.Add(time.Second)})
		if len(page) != 2 || page[0].ID != 5 || page[1].ID != 3 {
			t.Errorf("key a since 1 s: got %+v, want 5 and 3", page)
		}
		return nil
	})
}

// A policy's latest state: fields a new observation does not state keep
// their value; a hidden limit is replaced whole.
func TestKnown(t *testing.T) {
	db := newDB(t)
	obs := func(q, r int64, hasR bool) ratelimit.Observation {
		return ratelimit.Observation{Policy: "p", Unit: ratelimit.Requests, Quota: q, HasQuota: q > 0, Window: time.Minute,
			Remaining: r, HasRemaining: hasR, Reset: 30 * time.Second, HasReset: hasR, Shape: ratelimit.ShapeDraft}
	}
	put := func(k ledger.Known) { update(t, db, func(tx ledger.Tx) error { return tx.PutKnown(k) }) }
	get := func() ledger.Known {
		var ks []ledger.Known
		view(t, db, func(tx ledger.Tx) error {
			var err error
			ks, err = tx.Known("k")
			return err
		})
		if len(ks) != 1 {
			t.Fatalf("got %d policies, want 1", len(ks))
		}
		return ks[0]
	}
	put(ledger.Known{Key: "k", Observation: obs(100, 40, true), ReceivedAt: t0, BasisAt: t0, Route: "GET /a"})
	// Listed only (q and w): r, t and their times stay.
	put(ledger.Known{Key: "k", Observation: obs(100, 0, false), ReceivedAt: t0.Add(time.Second), BasisAt: t0.Add(time.Second), Route: "GET /b"})
	want := ledger.Known{Key: "k", Observation: obs(100, 40, true), ReceivedAt: t0, BasisAt: t0, Route: "GET /a"}
	if diff := cmp.Diff(get(), want); diff != "" {
		t.Errorf("after a listing (-got +want):\n%s", diff)
	}
	// Shown without q: q stays.
	put(ledger.Known{Key: "k", Observation: obs(0, 10, true), ReceivedAt: t0.Add(2 * time.Second), BasisAt: t0.Add(2 * time.Second), Route: "GET /c"})
	want = ledger.Known{Key: "k", Observation: obs(100, 10, true), ReceivedAt: t0.Add(2 * time.Second), BasisAt: t0.Add(2 * time.Second), Route: "GET /c"}
	if diff := cmp.Diff(get(), want); diff != "" {
		t.Errorf("after an r without q (-got +want):\n%s", diff)
	}

	hidden := func(q int64, w time.Duration, at time.Time) ledger.Known {
		return ledger.Known{Key: "h", Hidden: true, ReceivedAt: at, BasisAt: at.Add(-w), Route: "GET /x",
			Observation: ratelimit.Observation{Policy: "hidden", Unit: ratelimit.Requests, Quota: q, HasQuota: true, Window: w, Shape: ratelimit.ShapeInferred}}
	}
	put(hidden(10, time.Minute, t0))
	put(hidden(8, time.Hour, t0.Add(time.Hour)))
	view(t, db, func(tx ledger.Tx) error {
		ks, err := tx.Known("h")
		if diff := cmp.Diff(ks, []ledger.Known{hidden(8, time.Hour, t0.Add(time.Hour))}); diff != "" {
			t.Errorf("a hidden limit inferred again (-got +want):\n%s", diff)
		}
		return err
	})
}

func TestObservations(t *testing.T) {
	db := newDB(t)
	o := ledger.ObservationRecord{Key: "k", AttemptID: 7, Status: 200, ReceivedAt: t0, ServerDate: t0.Add(-time.Second),
		Method: "GET", Target: "/a", FromCache: true,
		Observation: ratelimit.Observation{Policy: "p", Unit: ratelimit.Requests, Partition: "pk", Quota: 5, HasQuota: true,
			Remaining: 4, HasRemaining: true, Shape: ratelimit.ShapeVendor, Profile: ratelimit.GitHub, Guessed: true}}
	update(t, db, func(tx ledger.Tx) error {
		if err := tx.AddObservation(o); err != nil {
			return err
		}
		o2 := o
		o2.Policy = "q"
		return tx.AddObservation(o2)
	})
	view(t, db, func(tx ledger.Tx) error {
		list, err := tx.Observations("k", 1)
		o.ID, o.Policy = 2, "q"
		if diff := cmp.Diff(list, []ledger.ObservationRecord{o}); diff != "" {
			t.Errorf("Observations (-got +want):\n%s", diff)
		}
		return err
	})
}

func TestGates(t *testing.T) {
	db := newDB(t)
	put := func(until time.Time, source string) {
		update(t, db, func(tx ledger.Tx) error {
			return tx.PutGate(ledger.Gate{Key: "k", Until: until, Source: source, Reason: source, SetAt: t0})
		})
	}
	put(t0.Add(time.Minute), "retry-after")
	put(t0.Add(time.Second), "backoff") // shorter: ignored
	view(t, db, func(tx ledger.Tx) error {
		gs, err := tx.Gates("k", t0)
		want := []ledger.Gate{{Key: "k", Until: t0.Add(time.Minute), Reason: "retry-after", Source: "retry-after", SetAt: t0}}
		if diff := cmp.Diff(gs, want); diff != "" {
			t.Errorf("a gate is never shortened (-got +want):\n%s", diff)
		}
		if gs, _ := tx.Gates("k", t0.Add(time.Minute)); len(gs) != 0 {
			t.Errorf("an open gate: got %+v, want none", gs)
		}
		return err
	})
	put(t0.Add(time.Hour), "circuit")
	view(t, db, func(tx ledger.Tx) error {
		gs, err := tx.Gates("k", t0)
		if len(gs) != 1 || gs[0].Source != "circuit" {
			t.Errorf("a longer gate: got %+v, want it to replace the shorter", gs)
		}
		return err
	})
}

func TestKeyStateAndWarnings(t *testing.T) {
	db := newDB(t)
	ks := ledger.KeyState{Key: "k", LastAdmitAt: t0, Interval: 250 * time.Millisecond, LastResponseAt: t0.Add(time.Second),
		Failures: 2, Opens: 1, HalfOpen: true, ProbeAttempt: 9, ProbeUntil: t0.Add(time.Minute),
		Latency: 1500 * time.Microsecond, PrevLatency: 12 * time.Millisecond, LatencySince: t0.Add(-time.Second)}
	update(t, db, func(tx ledger.Tx) error {
		if err := tx.PutKeyState(ks); err != nil {
			return err
		}
		for i := range 25 {
			if err := tx.AddWarning(ledger.Warning{Key: "k", At: t0.Add(time.Duration(i) * time.Second), Kind: "hidden-limit", Message: "m"}); err != nil {
				return err
			}
		}
		return nil
	})
	view(t, db, func(tx ledger.Tx) error {
		got, err := tx.KeyState("k")
		if diff := cmp.Diff(got, ks); diff != "" {
			t.Errorf("KeyState (-got +want):\n%s", diff)
		}
		if got, _ := tx.KeyState("never"); got != (ledger.KeyState{Key: "never"}) {
			t.Errorf("KeyState of a key never used: got %+v, want the zero state", got)
		}
		ws, _ := tx.Warnings("k", t0.Add(20*time.Second))
		if len(ws) != 4 || ws[0].ID != 25 {
			t.Errorf("Warnings after 20 s: got %d (first %+v), want 4, newest first", len(ws), ws)
		}
		if ws, _ := tx.Warnings("k", time.Time{}); len(ws) != 20 {
			t.Errorf("Warnings: got %d, want at most 20", len(ws))
		}
		keys, _ := tx.Keys()
		if diff := cmp.Diff(keys, []string{"k"}); diff != "" {
			t.Errorf("Keys (-got +want):\n%s", diff)
		}
		return err
	})
}

func TestSweep(t *testing.T) {
	db := newDB(t)
	var inFlight, old, recent int64
	update(t, db, func(tx ledger.Tx) error {
		var err error
		if inFlight, err = tx.InsertAttempt(ledger.Attempt{CallID: "a", Key: "k", State: ledger.Admitted, At: t0.Add(-30 * time.Minute), LeaseUntil: t0}); err != nil {
			return err
		}
		if old, err = tx.InsertAttempt(ledger.Attempt{CallID: "b", Key: "k", State: ledger.Confirmed, At: t0.Add(-2 * time.Hour)}); err != nil {
			return err
		}
		recent, err = tx.InsertAttempt(ledger.Attempt{CallID: "c", Key: "k", State: ledger.Admitted, At: t0, LeaseUntil: t0.Add(time.Minute)})
		return err
	})
	sweep(t, db, t0, t0.Add(-time.Hour))
	view(t, db, func(tx ledger.Tx) error {
		list, err := tx.Activity(ledger.ActivityFilter{})
		got := map[int64]string{}
		for _, a := range list {
			got[a.ID] = a.State
		}
		// The attempt whose lease ran out is interrupted; the one older than
		// the retention is gone.
		want := map[int64]string{inFlight: ledger.Interrupted, recent: ledger.Admitted}
		if diff := cmp.Diff(got, want); diff != "" {
			t.Errorf("after the sweep (-got +want):\n%s (old was %d)", diff, old)
		}
		return err
	})
}

// TestSweepInBatches: a sweep deletes everything older than its bound,
// however many batches that takes, and nothing younger; each batch is its
// own transaction of at most SweepBatch rows a table.
func TestSweepInBatches(t *testing.T) {
	db := newDB(t)
	old := 2*state.SweepBatch + 17
	update(t, db, func(tx ledger.Tx) error {
		for i := range old + 10 {
			at := t0.Add(-2*time.Hour + time.Duration(i)*time.Millisecond)
			if i >= old {
				at = t0.Add(time.Duration(i) * time.Millisecond)
			}
			if _, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint(i), Key: fmt.Sprint("k", i%3), State: ledger.Confirmed, At: at}); err != nil {
				return err
			}
		}
		return nil
	})
	got := sweep(t, db, t0, t0.Add(-time.Hour))
	if got.Attempts != int64(old) {
		t.Errorf("swept %d attempts, want %d", got.Attempts, old)
	}
	view(t, db, func(tx ledger.Tx) error {
		list, err := tx.Activity(ledger.ActivityFilter{Limit: 1000})
		if len(list) != 10 {
			t.Errorf("%d attempts left, want the 10 younger than the bound", len(list))
		}
		return err
	})
	if again := sweep(t, db, t0, t0.Add(-time.Hour)); again != (state.Swept{}) {
		t.Errorf("a second sweep changed %+v, want nothing", again)
	}
}

// TestActivityPagesInOrder: pages of one key and of every key, newest first by
// time, continue from a cursor without a gap or a repeat, whatever order
// the attempts were recorded in; a cursor the sweep deleted gives an empty
// page, not the newest again.
func TestActivityPagesInOrder(t *testing.T) {
	db := newDB(t)
	update(t, db, func(tx ledger.Tx) error {
		for i := range 50 {
			// Recorded out of order in time: every fifth a little late.
			at := t0.Add(time.Duration(i) * time.Second)
			if i%5 == 0 {
				at = at.Add(-2500 * time.Millisecond)
			}
			if _, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint(i), Key: fmt.Sprint("k", i%2), State: ledger.Confirmed, At: at}); err != nil {
				return err
			}
		}
		return nil
	})
	for _, key := range []string{"", "k1"} {
		var all []ledger.Attempt
		view(t, db, func(tx ledger.Tx) error {
			var err error
			all, err = tx.Activity(ledger.ActivityFilter{Key: key, Limit: 1000})
			return err
		})
		var paged []ledger.Attempt
		var before int64
		for {
			var page []ledger.Attempt
			view(t, db, func(tx ledger.Tx) error {
				var err error
				page, err = tx.Activity(ledger.ActivityFilter{Key: key, Before: before, Limit: 7})
				return err
			})
			if len(page) == 0 {
				break
			}
			paged = append(paged, page...)
			before = page[len(page)-1].ID
		}
		if diff := cmp.Diff(ids(paged), ids(all)); diff != "" || (key == "" && len(all) != 50) {
			t.Errorf("key %q: pages of 7 (-got +want, %d in all):\n%s", key, len(all), diff)
		}
		for i := 1; i < len(all); i++ {
			if all[i].At.After(all[i-1].At) {
				t.Errorf("key %q: attempt %d at %v comes after one at %v", key, all[i].ID, all[i].At, all[i-1].At)
			}
		}
	}
	view(t, db, func(tx ledger.Tx) error {
		page, err := tx.Activity(ledger.ActivityFilter{Before: 1 << 40})
		if len(page) != 0 {
			t.Errorf("a cursor that names no attempt gave %d attempts, want none", len(page))
		}
		return err
	})
}

func ids(list []ledger.Attempt) []int64 {
	out := make([]int64, len(list))
	for i, a := range list {
		out[i] = a.ID
	}
	return out
}

func TestResponses(t *testing.T) {
	db := newDB(t)
	update(t, db, func(tx ledger.Tx) error {
		for i, target := range []string{"/a", "/b", "/c"} {
			r := ledger.StoredResponse{Key: "k", Target: target, ETag: `"e"`, Status: 200, ContentType: "application/json",
				Body: []byte(target), Digest: "d", StoredAt: t0.Add(time.Duration(i) * time.Second), Unchanged: i}
			if err := tx.PutResponse(r, 2); err != nil {
				return err
			}
		}
		return nil
	})
	view(t, db, func(tx ledger.Tx) error {
		if _, ok, _ := tx.Response("k", "/a"); ok {
			t.Error("the oldest answer was kept beyond the limit of 2")
		}
		r, ok, err := tx.Response("k", "/c")
		want := ledger.StoredResponse{Key: "k", Target: "/c", ETag: `"e"`, Status: 200, ContentType: "application/json",
			Body: []byte("/c"), Digest: "d", StoredAt: t0.Add(2 * time.Second), Unchanged: 2}
		if diff := cmp.Diff(r, want); !ok || diff != "" {
			t.Errorf("Response (-got +want):\n%s", diff)
		}
		return err
	})
}

func TestClaims(t *testing.T) {
	db := newDB(t)
	update(t, db, func(tx ledger.Tx) error {
		if err := tx.Claim("k", "agent", t0.Add(time.Minute)); err != nil {
			return err
		}
		return tx.Claim("k", "agent", t0.Add(time.Second)) // never shortened
	})
	view(t, db, func(tx ledger.Tx) error {
		got, err := tx.Claimed("k", t0.Add(30*time.Second))
		if diff := cmp.Diff(got, map[string]bool{"agent": true}); diff != "" {
			t.Errorf("Claimed (-got +want):\n%s", diff)
		}
		if got, _ := tx.Claimed("k", t0.Add(time.Minute)); got != nil {
			t.Errorf("Claimed after it ended: got %v, want none", got)
		}
		return err
	})
}

// An error from the function rolls its transaction back.
func TestUpdateRollsBack(t *testing.T) {
	db := newDB(t)
	boom := errors.New("boom")
	err := db.Update(context.Background(), func(tx ledger.Tx) error {
		if _, err := tx.InsertAttempt(ledger.Attempt{CallID: "c", Key: "k", State: ledger.Admitted, At: t0}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Errorf("Update: got %v, want the function's error", err)
	}
	view(t, db, func(tx ledger.Tx) error {
		n, err := tx.Count("k", time.Time{})
		if n != 0 {
			t.Errorf("got %d attempts, want the insert rolled back", n)
		}
		return err
	})
}

// A writer in another process (another handle on the file) makes Update
// wait for it, not fail; readers are not held up meanwhile; a context
// that ends first ends the wait.
func TestUpdateWaitsForAnotherWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	a, b := open(t, path), open(t, path)
	holding, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		done <- a.Update(context.Background(), func(tx ledger.Tx) error {
			if _, err := tx.InsertAttempt(ledger.Attempt{CallID: "a", Key: "k", State: ledger.Admitted, At: t0}); err != nil {
				return err
			}
			close(holding)
			<-release
			return nil
		})
	}()
	<-holding

	ctx, cancel := context.WithCancel(context.Background())
	cancelled := make(chan error)
	go func() {
		cancelled <- b.Update(ctx, func(tx ledger.Tx) error { return nil })
	}()
	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Errorf("Update with its context cancelled while another writer holds the file: got %v, want context.Canceled", err)
	}

	view(t, b, func(tx ledger.Tx) error { // readers see the last commit meanwhile
		n, err := tx.Count("k", time.Time{})
		if n != 0 {
			t.Errorf("reader during another's write: got %d, want 0", n)
		}
		return err
	})
	waited := make(chan error)
	go func() {
		waited <- b.Update(context.Background(), func(tx ledger.Tx) error {
			_, err := tx.InsertAttempt(ledger.Attempt{CallID: "b", Key: "k", State: ledger.Admitted, At: t0.Add(time.Second)})
			return err
		})
	}()
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("Update waiting for another writer: %v", err)
	}
	view(t, a, func(tx ledger.Tx) error {
		n, err := tx.Count("k", time.Time{})
		if n != 2 {
			t.Errorf("got %d attempts, want both writers' 2", n)
		}
		return err
	})
}

// TestSweepGivesSpaceBack: after a sweep deletes most of a file's history,
// the file itself shrinks (incremental auto-vacuum), a megabyte a
// transaction.
func TestSweepGivesSpaceBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db := open(t, path)
	target := "/v1/items?" + strings.Repeat("q=x&", 200)
	update(t, db, func(tx ledger.Tx) error {
		for i := range 20000 {
			if _, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint(i), Key: "k", Caller: "sync", Target: target,
				State: ledger.Confirmed, At: t0.Add(time.Duration(i) * time.Millisecond)}); err != nil {
				return err
			}
		}
		return nil
	})
	before := pages(t, path)
	sweep(t, db, t0.Add(time.Hour), t0.Add(19*time.Second))
	after := pages(t, path)
	t.Logf("pages: %d before the sweep, %d after", before, after)
	if after > before/4 {
		t.Errorf("the file has %d pages after sweeping 95%% of its attempts, %d before; want it to shrink", after, before)
	}
}

// pages is the file's size in pages, read from its own header by another
// connection.
func pages(t *testing.T, path string) int {
	t.Helper()
	s := openScan(t, path)
	var n int
	if err := s.db.QueryRow("PRAGMA page_count").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
