package pacer

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// at returns t0 plus each of ds.
func at(ds ...time.Duration) []time.Time {
	out := make([]time.Time, len(ds))
	for i, d := range ds {
		out[i] = t0.Add(d)
	}
	return out
}

// every returns n times spaced by step, the first at start (from t0).
func every(start, step time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = start + time.Duration(i)*step
	}
	return out
}

func TestInferLimit(t *testing.T) {
	sec := time.Second
	tests := []struct {
		name  string
		sends []time.Duration // accepted before the refusal
		at    time.Duration   // the refusal
		ra    time.Duration
		hasRA bool
		want  limit
	}{
		{
			// A tight hourly limit of 100 under a generous minute limit: 100
			// calls in the first 50 s, then a refusal saying "come back when
			// the first leaves the hour".
			name: "fresh burst", sends: every(0, 500*time.Millisecond, 100), at: 50 * sec,
			ra: time.Hour - 50*sec, hasRA: true,
			want: limit{quota: 100, window: time.Hour, start: t0},
		},
		{
			// Retry-After rounded up to the second: the window is taken a
			// little long, never short.
			name: "rounded retry-after", sends: every(0, 500*time.Millisecond, 100), at: 50*sec + 300*time.Millisecond,
			ra: time.Hour - 50*sec, hasRA: true,
			want: limit{quota: 100, window: time.Hour + 300*time.Millisecond, start: t0},
		},
		{
			// A light afternoon, a quiet hour, then a burst into the limit:
			// the window began with the burst, not with the first call.
			name: "burst after a quiet spell",
			sends: append([]time.Duration{0, 5 * time.Minute, 10 * time.Minute},
				every(80*time.Minute, sec, 30)...),
			at: 80*time.Minute + 30*sec, ra: 30*time.Minute - 30*sec, hasRA: true,
			want: limit{quota: 30, window: 30 * time.Minute, start: t0.Add(80 * time.Minute)},
		},
		{
			// Calls at a steady pace of one every 10 s for an hour, under a
			// sliding limit of 20 per 200 s that this pace just meets, then
			// one 5 s early. The data cannot tell 20 per 200 s from 1 per
			// 10 s: the shorter is taken, at the same average pace.
			name:  "steady pace",
			sends: every(0, 10*sec, 360), at: 3595 * sec, ra: 5 * sec, hasRA: true,
			want: limit{quota: 1, window: 10 * sec, start: t0.Add(3590 * sec)},
		},
		{
			// A sliding hour of 100 met in two bursts ten minutes apart: the
			// pause before the second burst does not make it a window of its
			// own, as the first burst's calls would not fit before it.
			name:  "two bursts",
			sends: append(every(0, 500*time.Millisecond, 60), every(10*time.Minute, 500*time.Millisecond, 40)...),
			at:    10*time.Minute + 20*sec, ra: 49*time.Minute + 40*sec, hasRA: true,
			want: limit{quota: 100, window: time.Hour, start: t0},
		},
		{
			// No Retry-After: the window is at least a minute.
			name: "no retry-after", sends: every(0, 100*time.Millisecond, 120), at: 12 * sec,
			want: limit{quota: 120, window: time.Minute, start: t0},
		},
		{
			// Clock-aligned fixed windows of an hour: 90 calls late in one,
			// then a burst of 100 at the start of the next. Only the whole
			// history fits a sliding window: too generous a limit, which
			// the next refusal corrects (see TestHiddenLimitCostsOneRefusal).
			name:  "clock-aligned fixed window",
			sends: append(every(50*time.Minute, 6*sec, 90), every(60*time.Minute, 600*time.Millisecond, 100)...),
			at:    61 * time.Minute, ra: 59 * time.Minute, hasRA: true,
			want: limit{quota: 190, window: 70 * time.Minute, start: t0.Add(50 * time.Minute)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := inferLimit(at(tt.sends...), t0.Add(tt.at), tt.ra, tt.hasRA)
			if !ok {
				t.Fatal("inferLimit found nothing")
			}
			if diff := cmp.Diff(got, tt.want, cmp.AllowUnexported(limit{})); diff != "" {
				t.Errorf("inferLimit (-got +want):\n%s", diff)
			}
		})
	}
	if _, ok := inferLimit(nil, t0, time.Second, true); ok {
		t.Error("inferLimit with no accepted send found a limit; want none")
	}
}

func TestMaxBefore(t *testing.T) {
	sends := at(0, time.Second, 2*time.Second, 2*time.Second, 10*time.Second)
	for _, tt := range []struct {
		w    time.Duration
		want int64
	}{
		{500 * time.Millisecond, 1}, // the two sends at 2 s
		{time.Second, 1},            // (t-w, t) is open: 1 s before 2 s is out
		{1500 * time.Millisecond, 2},
		{time.Minute, 4},
	} {
		if got := maxBefore(sends, tt.w); got != tt.want {
			t.Errorf("maxBefore(%v) = %d, want %d", tt.w, got, tt.want)
		}
	}
}

func TestBackoff(t *testing.T) {
	for _, tt := range []struct {
		n    int
		r    float64
		want time.Duration
	}{
		{1, 0.5, 1500 * time.Millisecond},
		{1, 0, RetryFloor}, // never a near-immediate resend
		{2, 0.5, 2 * time.Second},
		{3, 0.5, 3 * time.Second},
		{4, 0.999, 8992 * time.Millisecond},
		{7, 1, BackoffCap},  // 65 s capped…
		{40, 1, BackoffCap}, // …however long the run
		{40, 0.25, RetryFloor + BackoffCap/4},
		{3, 0, RetryFloor}, // full jitter reaches the floor, not zero
	} {
		if got := backoff(tt.n, tt.r); got != tt.want {
			t.Errorf("backoff(%d, %v) = %v, want %v", tt.n, tt.r, got, tt.want)
		}
	}
}
