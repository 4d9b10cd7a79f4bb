package conformance

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
)

// history: what people read of the ledger, and how the sweep keeps it
// short.
var history = []behaviour{
	{"activity pages newest first, by key and since", activityPages},
	{"activity pages continue from a cursor without a gap or a repeat", activityPagesInOrder},
	{"a timeline counts per step and state, a call lists its attempts, an attempt its observations", timelineCallAndObservationsOf},
	{"observations read back newest first, with their context", observations},
	{"warnings read back newest first after a time, at most 20", warnings},
	{"the sweep interrupts what ran out and drops what is older than the retention", sweepInterruptsAndDrops},
	{"the sweep deletes everything older than its bound, in batches", sweepInBatches},
}

func activityPages(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	var id [5]int64
	update(t, s, func(tx ledger.Tx) error {
		for i := range id {
			key := "a"
			if i%2 == 1 {
				key = "b"
			}
			id[i] = insert(t, tx, ledger.Attempt{CallID: "c", Key: key, State: ledger.RejectedLocal, At: t0.Add(time.Duration(i) * time.Second)})
		}
		return nil
	})
	view(t, s, func(tx ledger.ReadTx) error {
		for _, c := range []struct {
			name string
			f    ledger.ActivityFilter
			want []int64
		}{
			{"the first page", ledger.ActivityFilter{Limit: 2}, []int64{id[4], id[3]}},
			{"the next page", ledger.ActivityFilter{Cursor: ledger.CursorAfter(ledger.Attempt{ID: id[3]}), Limit: 2}, []int64{id[2], id[1]}},
			{"the last page", ledger.ActivityFilter{Cursor: ledger.CursorAfter(ledger.Attempt{ID: id[1]}), Limit: 2}, []int64{id[0]}},
			{"key a since 1 s", ledger.ActivityFilter{Key: "a", Since: t0.Add(time.Second)}, []int64{id[4], id[2]}},
			{"key b since 3 s, at it", ledger.ActivityFilter{Key: "b", Since: t0.Add(3 * time.Second)}, []int64{id[3]}},
			{"every key since 4 s", ledger.ActivityFilter{Since: t0.Add(4 * time.Second)}, []int64{id[4]}},
			{"no limit: 100", ledger.ActivityFilter{}, []int64{id[4], id[3], id[2], id[1], id[0]}},
			{"a key never used", ledger.ActivityFilter{Key: "never"}, []int64{}},
		} {
			page, err := tx.Activity(c.f)
			if err != nil {
				return err
			}
			if diff := cmp.Diff(ids(page), c.want); diff != "" {
				t.Errorf("%s (-got +want):\n%s", c.name, diff)
			}
		}
		return nil
	})
}

// Pages of one key and of every key, newest first by time, continue from
// a cursor without a gap or a repeat, whatever order the attempts were
// recorded in; a cursor that names no attempt (the sweep deleted it)
// gives an empty page, not the newest again.
func activityPagesInOrder(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	var swept int64
	update(t, s, func(tx ledger.Tx) error {
		for i := range 50 {
			// Recorded out of order in time: every fifth a little late.
			at := t0.Add(time.Duration(i) * time.Second)
			if i%5 == 0 {
				at = at.Add(-2500 * time.Millisecond)
			}
			insert(t, tx, ledger.Attempt{CallID: fmt.Sprint(i), Key: fmt.Sprint("k", i%2), State: ledger.Confirmed, At: at})
		}
		swept = insert(t, tx, ledger.Attempt{CallID: "old", Key: "k1", State: ledger.Confirmed, At: t0.Add(-time.Hour)})
		return nil
	})
	sweep(t, s, t0, t0.Add(-time.Minute))
	for _, key := range []string{"", "k1"} {
		var all []ledger.Attempt
		view(t, s, func(tx ledger.ReadTx) error {
			var err error
			all, err = tx.Activity(ledger.ActivityFilter{Key: key, Limit: 1000})
			return err
		})
		var paged []ledger.Attempt
		var next ledger.Cursor
		for {
			var page []ledger.Attempt
			view(t, s, func(tx ledger.ReadTx) error {
				var err error
				page, err = tx.Activity(ledger.ActivityFilter{Key: key, Cursor: next, Limit: 7})
				return err
			})
			if len(page) == 0 {
				break
			}
			paged = append(paged, page...)
			next = ledger.CursorAfter(page[len(page)-1])
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
	view(t, s, func(tx ledger.ReadTx) error {
		for _, key := range []string{"", "k1"} {
			page, err := tx.Activity(ledger.ActivityFilter{Key: key, Cursor: ledger.CursorAfter(ledger.Attempt{ID: swept})})
			if err != nil {
				return err
			}
			if len(page) != 0 {
				t.Errorf("key %q: a cursor the sweep deleted gave %d attempts, want none", key, len(page))
			}
		}
		return nil
	})
}

// A timeline counts attempts per step and state by when each was sent
// (refused or admitted when never sent); a call lists its own attempts,
// and an attempt its own observations.
func timelineCallAndObservationsOf(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	var second int64
	update(t, s, func(tx ledger.Tx) error {
		add := func(call string, n int, st ledger.State, at time.Time) int64 {
			return insert(t, tx, ledger.Attempt{CallID: call, Attempt: n, Key: "k", Caller: "a", State: st, At: at})
		}
		first := add("c1", 1, ledger.Admitted, t0.Add(500*time.Millisecond))
		if err := tx.FinishAttempt(first, ledger.RejectedUpstream, reason.Reason{Kind: reason.Answered, Status: 429}, 429, t0.Add(1500*time.Millisecond), t0.Add(1600*time.Millisecond)); err != nil {
			return err
		}
		second = add("c1", 2, ledger.Admitted, t0.Add(2*time.Second))
		if err := tx.FinishAttempt(second, ledger.Confirmed, reason.Reason{Kind: reason.Answered, Status: 200}, 200, t0.Add(2100*time.Millisecond), t0.Add(2200*time.Millisecond)); err != nil {
			return err
		}
		add("c2", 1, ledger.RejectedLocal, t0.Add(2500*time.Millisecond))
		gone := add("c5", 1, ledger.Admitted, t0.Add(1200*time.Millisecond))
		if err := tx.FinishAttempt(gone, ledger.RejectedUpstream, reason.Reason{Kind: reason.Answered, Status: 404}, 404, t0.Add(1300*time.Millisecond), t0.Add(1400*time.Millisecond)); err != nil {
			return err
		}
		add("c3", 1, ledger.Cached, t0.Add(-time.Second))    // before the timeline
		add("c4", 1, ledger.Admitted, t0.Add(3*time.Second)) // in flight: by its admission
		return tx.AddObservation(ledger.ObservationRecord{Key: "k", AttemptID: second, Status: 200, ReceivedAt: t0.Add(2200 * time.Millisecond),
			Observation: ratelimit.Observation{Policy: "default", Unit: ratelimit.Requests, Quota: 10, HasQuota: true, Remaining: 3, HasRemaining: true}})
	}, "k")
	view(t, s, func(tx ledger.ReadTx) error {
		got, err := tx.Timeline("k", t0, time.Second)
		if err != nil {
			return err
		}
		want := []ledger.Bucket{
			{Start: t0.Add(time.Second), State: ledger.RejectedUpstream, Status: 404, Count: 1},
			{Start: t0.Add(time.Second), State: ledger.RejectedUpstream, Status: 429, Count: 1},
			{Start: t0.Add(2 * time.Second), State: ledger.Confirmed, Count: 1},
			{Start: t0.Add(2 * time.Second), State: ledger.RejectedLocal, Count: 1},
			{Start: t0.Add(3 * time.Second), State: ledger.Admitted, Count: 1},
		}
		if diff := cmp.Diff(got, want); diff != "" {
			t.Errorf("Timeline (-got +want):\n%s", diff)
		}
		if _, err := tx.Timeline("k", t0, 0); err == nil {
			t.Error("a Timeline of step 0: got no error")
		}
		call, err := tx.Call("k", "c1")
		if err != nil {
			return err
		}
		if len(call) != 2 || call[0].State != ledger.RejectedUpstream || call[1].State != ledger.Confirmed || call[1].ID != second {
			t.Errorf("call c1 = %+v, want its two attempts in order", call)
		}
		if other, err := tx.Call("other", "c1"); err != nil || len(other) != 0 {
			t.Errorf("call c1 of another key = %+v, %v; want none", other, err)
		}
		obs, err := tx.ObservationsOf("k", second)
		if err != nil {
			return err
		}
		if len(obs) != 1 || obs[0].Remaining != 3 || obs[0].Policy != "default" || obs[0].AttemptID != second {
			t.Errorf("observations of the second attempt = %+v, want the one it produced", obs)
		}
		none, err := tx.ObservationsOf("k", call[0].ID)
		if err != nil || len(none) != 0 {
			t.Errorf("observations of the first attempt = %+v, %v; want none", none, err)
		}
		return nil
	})
}

func observations(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	o := ledger.ObservationRecord{Key: "k", AttemptID: 7, Status: 200, ReceivedAt: t0, ServerDate: t0.Add(-time.Second),
		Method: "GET", Target: "/a", FromCache: true,
		Observation: ratelimit.Observation{Policy: "p", Unit: ratelimit.Requests, Partition: "pk", Quota: 5, HasQuota: true,
			Window: time.Minute, Remaining: 4, HasRemaining: true, Reset: 1500 * time.Millisecond, HasReset: true,
			Shape: ratelimit.ShapeVendor, Profile: ratelimit.GitHub, Guessed: true}}
	bare := ledger.ObservationRecord{Key: "k", Status: 429, ReceivedAt: t0.Add(time.Second), Method: "POST", Target: "/b",
		Observation: ratelimit.Observation{Policy: "q", Unit: ratelimit.Requests, Shape: ratelimit.ShapeDraft}}
	update(t, s, func(tx ledger.Tx) error {
		return errors.Join(tx.AddObservation(o), tx.AddObservation(bare),
			tx.AddObservation(ledger.ObservationRecord{Key: "other", ReceivedAt: t0, Observation: ratelimit.Observation{Policy: "p"}}))
	})
	view(t, s, func(tx ledger.ReadTx) error {
		list, err := own(tx).Observations("k", 10)
		if err != nil {
			return err
		}
		if len(list) != 2 || list[0].ID <= list[1].ID {
			t.Fatalf("Observations: got %+v, want 2, newest first", list)
		}
		o.ID, bare.ID = list[1].ID, list[0].ID
		if diff := cmp.Diff(list, []ledger.ObservationRecord{bare, o}); diff != "" {
			t.Errorf("Observations (-got +want):\n%s", diff)
		}
		latest, err := own(tx).Observations("k", 1)
		if diff := cmp.Diff(latest, []ledger.ObservationRecord{bare}); diff != "" {
			t.Errorf("the latest observation (-got +want):\n%s", diff)
		}
		return err
	})
}

func warnings(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	update(t, s, func(tx ledger.Tx) error {
		for i := range 25 {
			if err := tx.AddWarning(ledger.Warning{Key: "k", At: t0.Add(time.Duration(i) * time.Second), Kind: "hidden-limit", Reason: reason.Reason{Kind: reason.Said, Said: fmt.Sprint("m", i)}}); err != nil {
				return err
			}
		}
		return tx.AddWarning(ledger.Warning{Key: "other", At: t0.Add(time.Hour), Kind: "circuit-open", Reason: reason.Reason{Kind: reason.Said, Said: "x"}})
	})
	view(t, s, func(tx ledger.ReadTx) error {
		ws, err := tx.Warnings("k", t0.Add(20*time.Second))
		if err != nil {
			return err
		}
		var got []string
		for i, w := range ws {
			got = append(got, w.Reason.Said)
			if w.Key != "k" || w.Kind != "hidden-limit" || w.ID == 0 || (i > 0 && w.ID >= ws[i-1].ID) {
				t.Errorf("warning %d: %+v, want of key k, with an ID below the one before", i, w)
			}
		}
		if diff := cmp.Diff(got, []string{"m24", "m23", "m22", "m21"}); diff != "" {
			t.Errorf("Warnings after 20 s (-got +want):\n%s", diff)
		}
		if !ws[0].At.Equal(t0.Add(24 * time.Second)) {
			t.Errorf("the newest warning is at %v, want t0+24s", ws[0].At)
		}
		all, err := tx.Warnings("k", time.Time{})
		if len(all) != 20 || all[0].Reason.Said != "m24" {
			t.Errorf("Warnings: got %d, the first %+v; want the newest 20", len(all), all[0])
		}
		return err
	})
}

func sweepInterruptsAndDrops(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	var inFlight, old, recent, slot int64
	update(t, s, func(tx ledger.Tx) error {
		a := admission("k", "agent", t0.Add(-30*time.Minute))
		a.InFlightUntil = t0
		inFlight = insert(t, tx, a)
		old = insert(t, tx, ledger.Attempt{CallID: "b", Key: "k", State: ledger.Confirmed, At: t0.Add(-2 * time.Hour)})
		a = admission("k", "agent", t0)
		a.InFlightUntil = t0.Add(time.Minute)
		recent = insert(t, tx, a)
		first, _, err := tx.Reserve("k", 1, t0, t0) // its lease ran out
		slot = first
		if err := tx.AddObservation(ledger.ObservationRecord{Key: "k", ReceivedAt: t0.Add(-2 * time.Hour), Observation: ratelimit.Observation{Policy: "old"}}); err != nil {
			return err
		}
		if err := tx.AddObservation(ledger.ObservationRecord{Key: "k", ReceivedAt: t0, Observation: ratelimit.Observation{Policy: "new"}}); err != nil {
			return err
		}
		if err := tx.AddWarning(ledger.Warning{Key: "k", At: t0.Add(-2 * time.Hour), Kind: "x", Reason: reason.Reason{Kind: reason.Said, Said: "old"}}); err != nil {
			return err
		}
		return errors.Join(err, tx.AddWarning(ledger.Warning{Key: "k", At: t0, Kind: "x", Reason: reason.Reason{Kind: reason.Said, Said: "new"}}))
	}, "k")
	got := sweep(t, s, t0, t0.Add(-time.Hour))
	if want := (state.Swept{Interrupted: 2, Attempts: 1, Observations: 1, Warnings: 1}); got != want {
		t.Errorf("Sweep: got %+v, want %+v", got, want)
	}
	view(t, s, func(tx ledger.ReadTx) error {
		states := map[int64]ledger.State{}
		for _, s := range sendsIn(t, tx, "k") {
			states[s.ID] = s.State
		}
		// The attempt whose lease ran out is interrupted, the slot whose
		// lease ran out released; both stay counted. The one older than
		// the retention is gone.
		want := map[int64]ledger.State{inFlight: ledger.Interrupted, recent: ledger.Admitted, slot: ledger.Released}
		if diff := cmp.Diff(states, want); diff != "" {
			t.Errorf("after the sweep (-got +want):\n%s (old was %d)", diff, old)
		}
		if n, err := tx.Count("k", t0.Add(-time.Hour)); n != 3 || err != nil {
			t.Errorf("Count after the sweep: got %d, %v; want 3", n, err)
		}
		if f, err := tx.Flight("k", t0); f.Count != 1 || err != nil {
			t.Errorf("Flight after the sweep: got %+v, %v; want the recent one", f, err)
		}
		obs, err := own(tx).Observations("k", 10)
		if len(obs) != 1 || obs[0].Policy != "new" {
			t.Errorf("observations after the sweep: %+v, want the new one", obs)
		}
		ws, err2 := tx.Warnings("k", time.Time{})
		if len(ws) != 1 || ws[0].Reason.Said != "new" {
			t.Errorf("warnings after the sweep: %+v, want the new one", ws)
		}
		return errors.Join(err, err2)
	})
}

// sendsIn is Sends of every admission of key, in tx.
func sendsIn(t *testing.T, tx ledger.Reader, key string) []ledger.Send {
	t.Helper()
	out, err := tx.Sends(key, time.Time{}, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A sweep deletes everything older than its bound, however many batches
// that takes, and nothing younger; a second finds nothing.
func sweepInBatches(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	old := 2*state.SweepBatch + 17
	update(t, s, func(tx ledger.Tx) error {
		for i := range old + 10 {
			at := t0.Add(-2*time.Hour + time.Duration(i)*time.Millisecond)
			if i >= old {
				at = t0.Add(time.Duration(i) * time.Millisecond)
			}
			insert(t, tx, ledger.Attempt{CallID: fmt.Sprint(i), Key: fmt.Sprint("k", i%3), State: ledger.Confirmed, At: at})
		}
		return nil
	})
	got := sweep(t, s, t0, t0.Add(-time.Hour))
	if got.Attempts != int64(old) {
		t.Errorf("swept %d attempts, want %d", got.Attempts, old)
	}
	view(t, s, func(tx ledger.ReadTx) error {
		list, err := tx.Activity(ledger.ActivityFilter{Limit: 1000})
		if len(list) != 10 {
			t.Errorf("%d attempts left, want the 10 younger than the bound", len(list))
		}
		return err
	})
	if again := sweep(t, s, t0, t0.Add(-time.Hour)); again != (state.Swept{}) {
		t.Errorf("a second sweep changed %+v, want nothing", again)
	}
}
