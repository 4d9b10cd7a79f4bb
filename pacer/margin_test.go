package pacer

import (
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// The latency margin keeps the longest latency of the current period and
// the one before: at least the last period's, never one older than two.
func TestNoteLatency(t *testing.T) {
	const period = 10 * time.Second
	ms := time.Millisecond
	var ks ledger.KeyState
	steps := []struct {
		at   time.Duration // from t0
		lat  time.Duration
		want time.Duration // max(Latency, PrevLatency) after it
	}{
		{0, 5 * ms, 5 * ms},
		{time.Second, 2 * ms, 5 * ms},
		{9 * time.Second, 30 * ms, 30 * ms},
		{11 * time.Second, ms, 30 * ms},                // a new period: the last one's 30 ms still counts
		{20 * time.Second, ms, 30 * ms},                // still within a period of it
		{22 * time.Second, 3 * ms, 3 * ms},             // the 30 ms is two periods old
		{60 * time.Second, ms, ms},                     // after a long quiet spell, nothing older
		{61 * time.Second, 5 * time.Second, MaxMargin}, // bounded
	}
	for _, s := range steps {
		noteLatency(&ks, s.lat, t0.Add(s.at), period)
		if got := max(ks.Latency, ks.PrevLatency); got != s.want {
			t.Errorf("after %v at %v: got a margin of %v, want %v", s.lat, s.at, got, s.want)
		}
	}
}

func TestMarginCap(t *testing.T) {
	for w, want := range map[time.Duration]time.Duration{
		4 * time.Second: 200 * time.Millisecond,
		time.Minute:     time.Second,
		time.Hour:       time.Second,
	} {
		if got := marginCap(w); got != want {
			t.Errorf("marginCap(%v) = %v, want %v", w, got, want)
		}
	}
}

// The percentile of the send delays a process measures: one slow send
// among many does not move it, a few do, and none older than delayMemory
// counts.
func TestSendDelaysPercentile(t *testing.T) {
	ms := time.Millisecond
	const period = time.Hour // the longest is not what this test is about
	var s sendDelays
	high := func(at time.Duration) time.Duration { return s.estimate(t0.Add(at)).high }
	if got := high(0); got != 0 {
		t.Fatalf("no sends: got %v, want 0", got)
	}
	for i := range 20 {
		s.note(t0.Add(time.Duration(i)*time.Second), 10*ms, true, period)
	}
	s.note(t0.Add(20*time.Second), 500*ms, false, period)
	if got := high(20 * time.Second); got != 10*ms {
		t.Errorf("one slow send in 21: got %v, want 10ms", got)
	}
	s.note(t0.Add(21*time.Second), 400*ms, false, period)
	s.note(t0.Add(22*time.Second), 300*ms, true, period)
	if got := high(22 * time.Second); got != 400*ms {
		t.Errorf("three slow sends in 23: got %v, want 400ms (the 22nd of 23)", got)
	}
	// A minute after the first ten, only the later ones count: 10 of
	// 10 ms and the three slow ones, of which the 95th percentile is the
	// slowest.
	if got := high(delayMemory + 9*time.Second + ms); got != 500*ms {
		t.Errorf("the first ten forgotten: got %v, want 500ms", got)
	}
	if got := high(22*time.Second + delayMemory); got != 0 {
		t.Errorf("all forgotten: got %v, want 0", got)
	}
	// The ring holds the latest delaySamples: a hundred quick sends push
	// the slow ones out.
	for i := range 100 {
		s.note(t0.Add(30*time.Second+time.Duration(i)*ms), ms, true, period)
	}
	if s.n != delaySamples {
		t.Errorf("the ring holds %d, want %d", s.n, delaySamples)
	}
	if got := high(31 * time.Second); got != ms {
		t.Errorf("after 100 quick sends: got %v, want 1ms", got)
	}
}

// The longest delay of the sends that went is kept for at least a period
// (a send may be in a window that long), whatever came after it; a send
// that did not go (it was late, and admitted again) is not kept.
func TestSendDelaysLongest(t *testing.T) {
	const period = 10 * time.Second
	ms := time.Millisecond
	var s sendDelays
	steps := []struct {
		at   time.Duration // from t0
		d    time.Duration
		went bool
		want time.Duration // the longest after it
	}{
		{0, 5 * ms, true, 5 * ms},
		{time.Second, 900 * ms, false, 5 * ms}, // late: not sent
		{2 * time.Second, 300 * ms, true, 300 * ms},
		{9 * time.Second, ms, true, 300 * ms},
		{11 * time.Second, ms, true, 300 * ms}, // a new period: the last one's still counts
		{19 * time.Second, ms, true, 300 * ms},
		{22 * time.Second, 2 * ms, true, 2 * ms}, // two periods old: forgotten
		{60 * time.Second, ms, true, ms},
	}
	for _, st := range steps {
		s.note(t0.Add(st.at), st.d, st.went, period)
		if got := s.estimate(t0.Add(st.at)).longest; got != st.want {
			t.Errorf("after %v (went: %v) at %v: the longest is %v, want %v", st.d, st.went, st.at, got, st.want)
		}
	}
	// With no send since, what was kept is forgotten after two periods.
	if got := s.estimate(t0.Add(60*time.Second + period - ms)).longest; got != ms {
		t.Errorf("a period on: got %v, want 1ms", got)
	}
	if got := s.estimate(t0.Add(60*time.Second + 2*period)).longest; got != 0 {
		t.Errorf("two periods on: got %v, want 0", got)
	}
}

// The margin follows the measured send delay when it is longer than the
// latency margin, within sendMarginCap, and never falls below the
// latency margin.
func TestMarginFollowsSendDelay(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		latency, delay, w time.Duration
		want              time.Duration
	}{
		{0, 0, 4 * time.Second, 0},
		{100 * ms, 50 * ms, 4 * time.Second, 100 * ms},         // the latency margin is the floor
		{100 * ms, 400 * ms, 4 * time.Second, 400 * ms},        // a longer send delay raises it
		{100 * ms, 2 * time.Second, 4 * time.Second, 500 * ms}, // within w/8
		{5 * time.Second, 0, 4 * time.Second, 200 * ms},        // the latency margin keeps its own cap
		{0, 3 * time.Second, time.Minute, 3 * time.Second},
		{0, 9 * time.Second, time.Hour, MaxSendMargin},
		{0, 9 * time.Second, 2 * time.Second, 250 * ms},
	} {
		s := snapshot{now: t0, ks: ledger.KeyState{Latency: c.latency, LatencySince: t0}, delay: delayEstimate{longest: c.delay}}
		if got := s.margin(c.w); got != c.want {
			t.Errorf("latency %v, send delay %v, window %v: margin %v, want %v", c.latency, c.delay, c.w, got, c.want)
		}
	}
	for w, want := range map[time.Duration]time.Duration{
		100 * time.Millisecond: 12500 * time.Microsecond, // w/8
		4 * time.Second:        500 * ms,
		time.Minute:            MaxSendMargin,
		time.Hour:              MaxSendMargin,
	} {
		if got := sendMarginCap(w); got != want {
			t.Errorf("sendMarginCap(%v) = %v, want %v", w, got, want)
		}
	}
}
