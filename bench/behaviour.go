package bench

import (
	"fmt"
	"strings"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/demo"
)

// A Behaviour is one way the simulated upstream announces and enforces
// its limit: a row of the benchmark.
type Behaviour struct {
	// Name is how flags and the table name it: seed, sliding, hidden,
	// github, retry-after, silent, liar, servers.
	Name string
	// Title describes it in the table.
	Title string
	// Mode is the demo upstream's mode.
	Mode demo.Mode
	// Servers is how many upstream servers each count their own window;
	// 0 means one.
	Servers int
	// Profile is the header profile of mcp-quota's key ("ietf" or
	// "github").
	Profile string
	// Policy names the documented policy in the key's configuration, as
	// the upstream names it.
	Policy string
	// Hidden reports that the upstream enforces a limit that is not
	// documented: mcp-quota's target is at most one 429 per discovery
	// instead of none.
	Hidden bool
}

// Behaviours returns every behaviour of the benchmark, in table order.
func Behaviours() []Behaviour {
	return []Behaviour{
		{Name: "seed", Title: "seed: fixed window, RateLimit + X-RateLimit-*", Mode: demo.FixedWindow, Profile: "ietf", Policy: "default"},
		{Name: "sliding", Title: "sliding window", Mode: demo.Sliding, Profile: "ietf", Policy: "default"},
		{Name: "hidden", Title: "tight long policy under a generous short one, only the closest shown", Mode: demo.HiddenLong, Profile: "ietf", Policy: "minute", Hidden: true},
		{Name: "github", Title: "vendor headers only (GitHub, epoch reset, 403)", Mode: demo.GitHubStyle, Profile: "github", Policy: "default"},
		{Name: "retry-after", Title: "Retry-After only", Mode: demo.RetryAfterOnly, Profile: "ietf", Policy: "default"},
		{Name: "silent", Title: "no headers at all", Mode: demo.Silent, Profile: "ietf", Policy: "default"},
		{Name: "liar", Title: "absurdly generous r/t, real limit enforced", Mode: demo.Liar, Profile: "ietf", Policy: "default"},
		{Name: "servers", Title: "4 servers, each counting its own window", Mode: demo.FixedWindow, Servers: 4, Profile: "ietf", Policy: "default"},
	}
}

// BehaviourNamed returns the behaviour called name.
func BehaviourNamed(name string) (Behaviour, error) {
	var names []string
	for _, b := range Behaviours() {
		if b.Name == name {
			return b, nil
		}
		names = append(names, b.Name)
	}
	return Behaviour{}, fmt.Errorf("unknown behaviour %q (want one of %s)", name, strings.Join(names, ", "))
}

// Scale is the size of the simulated limit: Quota calls per Window, and
// for the hidden behaviour a long policy of LongQuota per LongWindow.
type Scale struct {
	Quota      int
	Window     time.Duration
	LongQuota  int
	LongWindow time.Duration
}

// DefaultScale is the full benchmark's limit: 40 calls per 4 s (the
// seed's 120 per minute with the window cut 15 times and the quota 3
// times), and for the hidden behaviour 60 calls per 12 s, which allows
// half the short policy's pace.
var DefaultScale = Scale{Quota: 40, Window: 4 * time.Second, LongQuota: 60, LongWindow: 12 * time.Second}

// With returns s with another window and quota: window 0 keeps s's, and
// quota 0 scales s's with the window so that the pace stays the same. The
// long policy stays 3/2 of the quota per 3 windows.
func (s Scale) With(window time.Duration, quota int) Scale {
	if window <= 0 {
		window = s.Window
	}
	if quota <= 0 {
		quota = max(1, int(float64(s.Quota)*float64(window)/float64(s.Window)+0.5))
	}
	return Scale{Quota: quota, Window: window, LongQuota: max(quota+1, quota*3/2), LongWindow: 3 * window}
}

// Upstream returns the demo configuration of behaviour b at scale s,
// accepting only token. clk is its clock; nil means real time.
func (b Behaviour) Upstream(s Scale, token string, clk clock.Clock) demo.Config {
	return demo.Config{
		Mode:       b.Mode,
		Quota:      s.Quota,
		Window:     s.Window,
		LongQuota:  s.LongQuota,
		LongWindow: s.LongWindow,
		Servers:    b.Servers,
		Records:    100,
		Tokens:     []string{token},
		Clock:      clk,
	}
}
