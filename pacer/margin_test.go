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
