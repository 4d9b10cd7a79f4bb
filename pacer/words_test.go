package pacer

import (
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/ratelimit"
)

func TestFormatDuration(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0 s"},
		{0, "0 s"},
		{time.Microsecond, "under a second"},
		{31 * time.Millisecond, "under a second"},
		{999 * time.Millisecond, "under a second"},
		{time.Second, "1 s"},
		{1500 * time.Millisecond, "2 s"}, // rounded up, as retry_after_s is
		{31 * time.Second, "31 s"},
		{42*time.Second + time.Millisecond, "43 s"},
		{time.Minute, "60 s"},
		{119 * time.Second, "119 s"},
		{119*time.Second + time.Millisecond, "2 min"},
		{3*time.Minute + 20*time.Second, "4 min"},
		{59 * time.Minute, "59 min"},
		{59*time.Minute + time.Second, "1 h"},
		{time.Hour + 5*time.Minute, "1 h 5 min"},
		{time.Hour + 4*time.Minute + time.Second, "1 h 5 min"},
		{26 * time.Hour, "26 h"},
	} {
		if got := FormatDuration(tt.d); got != tt.want {
			t.Errorf("FormatDuration(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestPace(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{3400 * time.Millisecond, "about one every 4 s"},
		{500 * time.Millisecond, "about 2 a second"},
		{300 * time.Millisecond, "about 3 a second"},
		{900 * time.Millisecond, "about one a second"},
		{6 * time.Minute, "about one every 6 min"},
	} {
		if got := pace(tt.d); got != tt.want {
			t.Errorf("pace(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestHowMany(t *testing.T) {
	tests := []struct {
		n    int64
		unit ratelimit.Unit
		want string
	}{
		{1, ratelimit.Requests, "1 call is"},
		{0, ratelimit.Requests, "0 calls are"},
		{119, "", "119 calls are"},
		{1, ratelimit.ContentBytes, "1 content byte is"},
		{2048, ratelimit.ContentBytes, "2048 content bytes are"},
	}
	for _, tt := range tests {
		if got := howMany(tt.n, tt.unit); got != tt.want {
			t.Errorf("howMany(%d, %q) = %q, want %q", tt.n, tt.unit, got, tt.want)
		}
	}
}
