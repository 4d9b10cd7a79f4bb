package demo_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/demo"
)

func TestParseMode(t *testing.T) {
	for _, m := range demo.Modes() {
		if got, err := demo.ParseMode(string(m)); got != m || err != nil {
			t.Errorf("ParseMode(%q) = %q, %v; want %q, nil", m, got, err, m)
		}
	}
	if got, err := demo.ParseMode(""); got != demo.FixedWindow || err != nil {
		t.Errorf(`ParseMode("") = %q, %v; want seed, nil`, got, err)
	}
	if _, err := demo.ParseMode("gcra"); err == nil {
		t.Error(`ParseMode("gcra"): got no error, want one`)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name  string
		cfg   demo.Config
		valid bool
	}{
		{"zero", demo.Config{}, true},
		{"unknown mode", demo.Config{Mode: "gcra"}, false},
		{"negative quota", demo.Config{Quota: -1}, false},
		{"negative window", demo.Config{Window: -time.Second}, false},
		{"negative long quota", demo.Config{LongQuota: -1}, false},
		{"negative long window", demo.Config{LongWindow: -time.Second}, false},
		{"negative servers", demo.Config{Servers: -1}, false},
		{"negative records", demo.Config{Records: -1}, false},
		{"as many servers as calls", demo.Config{Quota: 3, Servers: 3}, true},
		{"more servers than calls", demo.Config{Quota: 3, Servers: 4}, false},
		{"more servers than long calls", demo.Config{Mode: demo.HiddenLong, Quota: 10, LongQuota: 3, Servers: 4}, false},
		{"github 429", demo.Config{GitHubStatus: http.StatusTooManyRequests}, true},
		{"github 503", demo.Config{GitHubStatus: http.StatusServiceUnavailable}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if (err == nil) != tt.valid {
				t.Errorf("got error %v, want valid %v", err, tt.valid)
			}
			defer func() {
				if panicked := recover() != nil; panicked == tt.valid {
					t.Errorf("New: got panic %v, want %v", panicked, !tt.valid)
				}
			}()
			demo.New(tt.cfg)
		})
	}
}
