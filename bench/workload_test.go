package bench

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// script is a fake caller on a test's clock: each call moves the clock
// on by its step's time and ends as the step says.
type script struct {
	clock *testkit.Clock
	steps []step
	i     int
}

type step struct {
	took time.Duration
	ok   bool
	err  error
}

func (s *script) call(context.Context) (bool, error) {
	st := s.steps[s.i%len(s.steps)]
	s.i++
	s.clock.Advance(st.took)
	return st.ok, st.err
}

func (s *script) close() {}

func TestGreedy(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	tests := []struct {
		name  string
		steps []step
		run   time.Duration
		want  Tally
	}{{
		name:  "every call accepted",
		steps: []step{{took: 10 * ms, ok: true}},
		run:   95 * ms,
		want:  Tally{Accepted: 9, LongestWait: 10 * ms},
	}, {
		name: "give-ups count into the wait of the call that follows",
		steps: []step{
			{took: 10 * ms, ok: true},
			{took: 300 * ms},
			{took: 200 * ms, ok: true},
		},
		run:  1000 * ms, // answers at 10, 310, 510, 520, 820; the one at 1020 is too late
		want: Tally{Accepted: 3, GaveUp: 2, LongestWait: 500 * ms},
	}, {
		name: "a call still waiting at the end counts up to the end",
		steps: []step{
			{took: 10 * ms, ok: true},
			{took: 5000 * ms, ok: true},
		},
		run:  1000 * ms,
		want: Tally{Accepted: 1, LongestWait: 990 * ms},
	}, {
		name:  "errors are counted, not waited on",
		steps: []step{{took: 100 * ms, err: errors.New("connection refused")}, {took: 100 * ms, ok: true}},
		run:   400 * ms, // the answer at 400 is too late
		want:  Tally{Accepted: 1, Errors: 2, FirstError: "connection refused", LongestWait: 200 * ms},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &script{clock: testkit.NewClock(start), steps: tt.steps}
			got := greedy(context.Background(), s, start.Add(tt.run), s.clock)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("greedy tally (-want +got):\n%s", diff)
			}
		})
	}
}
