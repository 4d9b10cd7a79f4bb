package upstream

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// steps are events as "kind state status" lines.
func steps(events []Event) []string {
	var out []string
	for _, e := range events {
		kind := map[EventKind]string{Refused: "refused", Attempted: "attempted", Ended: "ended"}[e.Kind]
		out = append(out, kind+" "+e.State+" "+http.StatusText(e.Status))
	}
	return out
}

// The hook sees every attempt and the end of every call, once, in the
// states the activity records — for calls answered, retried, refused
// locally and answered from a stored copy.
func TestObserveSeesEveryStepOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{answer: func(n int, r *http.Request) *http.Response {
			if n == 0 {
				return respond(http.StatusTooManyRequests, "Retry-After", "3")
			}
			return respond(http.StatusOK)
		}}
		c, db := newClient(t, f)
		var o testkit.List[Event] // what the Observe hook is told
		c.Observe = o.Add
		k := newKey(t, "bearer")
		ctx := context.Background()

		// Retried after a 429, then answered.
		resp, err := c.Do(ctx, k, Request{Caller: "a", Transport: "rest", Path: "/x", MaxWait: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		// Refused locally: the next answer says wait, and this caller will not.
		f.answer = func(int, *http.Request) *http.Response {
			return respond(http.StatusTooManyRequests, "Retry-After", "60")
		}
		resp, err = c.Do(ctx, k, Request{Caller: "a", Transport: "rest", Path: "/y"})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		_, err = c.Do(ctx, k, Request{Caller: "a", Transport: "rest", Path: "/z"})
		if !errors.Is(err, pacer.ErrPaused) {
			t.Fatalf("err = %v, want a pause", err)
		}
		// Answered from a stored copy.
		if err := c.RecordCached(ctx, k, Request{Caller: "b", Transport: "stdio"}, "/x", reason.Reason{Kind: reason.LoopGuard}, time.Now()); err != nil {
			t.Fatal(err)
		}

		want := []string{
			"attempted rejected_upstream Too Many Requests",
			"attempted confirmed OK",
			"ended confirmed OK",
			"attempted rejected_upstream Too Many Requests",
			"ended rejected_upstream Too Many Requests",
			"refused rejected_local ",
			"ended rejected_local ",
			"ended cached ",
		}
		if diff := cmp.Diff(want, steps(o.All())); diff != "" {
			t.Errorf("events (-want +got):\n%s", diff)
		}
		// The activity holds the same steps.
		if got, want := states(activity(t, db)), []string{"rejected_upstream", "confirmed", "rejected_upstream", "rejected_local", "cached"}; !cmp.Equal(got, want) {
			t.Errorf("activity = %v, want %v", got, want)
		}
		for _, e := range o.All() {
			if e.Key != "k" || e.CallID == "" {
				t.Errorf("event without key or call: %+v", e)
			}
			if e.Kind == Refused && e.Source != "retry-after" {
				t.Errorf("refusal source = %q, want retry-after", e.Source)
			}
		}
	})
}
