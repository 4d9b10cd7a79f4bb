package demo_test

import (
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/demo"
)

func TestMaxInWindow(t *testing.T) {
	at := func(ss ...float64) []time.Time {
		ts := make([]time.Time, len(ss))
		for i, s := range ss {
			ts[i] = t0.Add(time.Duration(s * float64(time.Second)))
		}
		return ts
	}
	tests := []struct {
		name     string
		accepted []time.Time
		window   time.Duration
		want     int
	}{
		{"none", nil, time.Minute, 0},
		{"one", at(5), time.Minute, 1},
		{"all in one window", at(0, 1, 2, 59.9), time.Minute, 4},
		{"the window is half-open", at(0, 60), time.Minute, 1},
		{"busiest window in the middle", at(0, 50, 55, 58, 100, 130), time.Minute, 4},
		{"simultaneous calls", at(3, 3, 3, 70), time.Minute, 3},
		{"out of order", at(58, 0, 55, 50), time.Minute, 4},
		{"zero window", at(1, 2), 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (demo.Stats{Accepted: tt.accepted}).MaxInWindow(tt.window); got != tt.want {
				t.Errorf("got %d, want %d", got, tt.want)
			}
		})
	}
}

func TestReset(t *testing.T) {
	c := newClock()
	api := newAPI(c, demo.Config{Quota: 1})
	get(t, api, "key", 1, 200)
	get(t, api, "key", 1, 429)
	api.Reset()
	if got := api.Stats("key"); got.Requests != 0 {
		t.Errorf("after Reset: got %+v, want zero Stats", got)
	}
	get(t, api, "key", 1, 200)
}

func TestStatsIsACopy(t *testing.T) {
	api := newAPI(newClock(), demo.Config{})
	get(t, api, "key", 2, 200)
	s := api.Stats("key")
	s.Accepted[0] = time.Time{}
	if api.Stats("key").Accepted[0].IsZero() {
		t.Error("changing a returned Stats changed the API's")
	}
}
