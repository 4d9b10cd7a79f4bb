package bench_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/bench"
)

func TestAllowed(t *testing.T) {
	s := bench.DefaultScale // 40 per 4 s; hidden: also 60 per 12 s
	tests := []struct {
		behaviour string
		windows   float64
		want      int
	}{
		{"seed", 6, 240},
		{"seed", 6.5, 280}, // a seventh window starts inside the run
		{"sliding", 6, 240},
		{"hidden", 6, 120}, // two long windows of 60
		{"hidden", 3, 60},
		{"hidden", 1, 40}, // the short policy binds first
		{"github", 6, 240},
		{"retry-after", 6, 240},
		{"silent", 6, 240},
		{"liar", 6, 240},
		{"servers", 6, 240}, // four servers of 10 each
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%g", tt.behaviour, tt.windows), func(t *testing.T) {
			b, err := bench.BehaviourNamed(tt.behaviour)
			if err != nil {
				t.Fatal(err)
			}
			d := time.Duration(tt.windows * float64(s.Window))
			if got := bench.Allowed(b.Upstream(s, "", nil), d); got != tt.want {
				t.Errorf("Allowed(%s, %s) = %d, want %d", tt.behaviour, d, got, tt.want)
			}
		})
	}
}

func TestSustained(t *testing.T) {
	s := bench.DefaultScale
	seed, _ := bench.BehaviourNamed("seed")
	oracle := bench.Oracle(seed.Upstream(s, "", nil), 6*s.Window)
	// bursts shifts the oracle's pattern: every window opens late by its
	// index times lag.
	bursts := func(lag time.Duration) []time.Duration {
		var out []time.Duration
		for i, t := range oracle {
			out = append(out, t+time.Duration(i/s.Quota)*lag+time.Millisecond)
		}
		return out
	}
	// smooth is a call every Window/Quota from the start.
	var smooth []time.Duration
	for i := range 6 * s.Quota {
		smooth = append(smooth, time.Duration(i)*s.Window/time.Duration(s.Quota)+time.Millisecond)
	}
	tests := []struct {
		name     string
		accepted []time.Duration
		want     float64
		ok       bool
	}{
		{"the oracle itself, a millisecond late", bursts(0), 1, true},
		{"windows opened 0.4 s late", bursts(400 * time.Millisecond), 4.0 / 4.4, true},
		{"the run's last window missed", bursts(400 * time.Millisecond)[:5*s.Quota], 4.0 / 4.4, true},
		{"smooth at the documented pace", smooth, 1, true},
		{"not a window's worth", smooth[:s.Quota], 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := bench.Sustained(tt.accepted, oracle)
			if ok != tt.ok || math.Abs(got-tt.want) > 0.002 {
				t.Errorf("Sustained = %.4f, %v; want %.4f, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

// ExampleAllowed shows what the reference API's upstream allows one key in three
// windows: its quota three times over.
func ExampleAllowed() {
	b, _ := bench.BehaviourNamed("seed")
	s := bench.DefaultScale
	fmt.Println(bench.Allowed(b.Upstream(s, "", nil), 3*s.Window))
	// Output: 120
}
