package state_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// A timeline counts attempts per step and state by when each was sent
// (refused or admitted when never sent); a call lists its own attempts,
// and an attempt its own observations.
func TestTimelineCallAndObservationsOf(t *testing.T) {
	db := newDB(t)
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	var second int64
	update(t, db, func(tx ledger.Tx) error {
		add := func(call string, n int, st string, at time.Time) int64 {
			id, err := tx.InsertAttempt(ledger.Attempt{CallID: call, Attempt: n, Key: "k", Caller: "a", State: st, At: at})
			if err != nil {
				t.Fatal(err)
			}
			return id
		}
		first := add("c1", 1, ledger.Admitted, t0.Add(500*time.Millisecond))
		if err := tx.FinishAttempt(first, ledger.RejectedUpstream, "HTTP 429", 429, t0.Add(1500*time.Millisecond), t0.Add(1600*time.Millisecond)); err != nil {
			return err
		}
		second = add("c1", 2, ledger.Admitted, t0.Add(2*time.Second))
		if err := tx.FinishAttempt(second, ledger.Confirmed, "HTTP 200", 200, t0.Add(2100*time.Millisecond), t0.Add(2200*time.Millisecond)); err != nil {
			return err
		}
		add("c2", 1, ledger.RejectedLocal, t0.Add(2500*time.Millisecond))
		add("c3", 1, ledger.Cached, t0.Add(-time.Second)) // before the timeline
		return tx.AddObservation(ledger.ObservationRecord{Key: "k", AttemptID: second, Status: 200, ReceivedAt: t0.Add(2200 * time.Millisecond),
			Observation: ratelimit.Observation{Policy: "default", Unit: ratelimit.Requests, Quota: 10, HasQuota: true, Remaining: 3, HasRemaining: true}})
	})
	view(t, db, func(tx ledger.Tx) error {
		got, err := tx.Timeline("k", t0, time.Second)
		if err != nil {
			return err
		}
		want := []ledger.Bucket{
			{Start: t0.Add(time.Second), State: ledger.RejectedUpstream, Count: 1},
			{Start: t0.Add(2 * time.Second), State: ledger.Confirmed, Count: 1},
			{Start: t0.Add(2 * time.Second), State: ledger.RejectedLocal, Count: 1},
		}
		if diff := cmp.Diff(want, got, cmp.Comparer(time.Time.Equal)); diff != "" {
			t.Errorf("timeline (-want +got):\n%s", diff)
		}
		call, err := tx.Call("k", "c1")
		if err != nil {
			return err
		}
		if len(call) != 2 || call[0].State != ledger.RejectedUpstream || call[1].State != ledger.Confirmed {
			t.Errorf("call c1 = %+v, want its two attempts in order", call)
		}
		obs, err := tx.ObservationsOf("k", second)
		if err != nil {
			return err
		}
		if len(obs) != 1 || obs[0].Remaining != 3 || obs[0].Policy != "default" {
			t.Errorf("observations of the second attempt = %+v, want the one it produced", obs)
		}
		none, err := tx.ObservationsOf("k", call[0].ID)
		if err != nil || len(none) != 0 {
			t.Errorf("observations of the first attempt = %+v, %v; want none", none, err)
		}
		return nil
	})
}
