package pacer

import (
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// The log records a send when it is admitted, but the upstream counts it
// from when it receives it, a moment later. A call admitted the instant a
// send leaves the log's window could therefore reach the upstream before
// that send has left the upstream's window, and be refused. So a send
// stays in the log's window of w for w plus a margin: the longest time
// from admission to answer recently seen on the key (an answer comes
// after its request was received), or, while a call is still in flight,
// as long as it has been. The margin is bounded, so that a slow endpoint
// (whose answers take long after they were received) cannot stall a key.
const (
	// MaxMargin bounds the margin in any window.
	MaxMargin = time.Second
	// marginShare bounds the margin in a window of w to w/marginShare.
	marginShare = 20
)

// marginCap is the most a send stays in a window of w beyond w.
func marginCap(w time.Duration) time.Duration {
	return min(MaxMargin, w/marginShare)
}

// margin is how long beyond w a send stays in a window of w, as of s: the
// key's recent admission-to-answer latency, or the age of its oldest call
// in flight when that is longer, within marginCap(w).
func (s snapshot) margin(w time.Duration) time.Duration {
	m := latencyMargin(s.ks, w)
	if !s.flight.Oldest.IsZero() {
		m = max(m, min(s.now.Sub(s.flight.Oldest), marginCap(w)))
	}
	return m
}

// latencyMargin is how long beyond w a send stays in a window of w for
// the latencies ks has seen: the longest recent one, within marginCap(w).
func latencyMargin(ks ledger.KeyState, w time.Duration) time.Duration {
	return min(max(ks.Latency, ks.PrevLatency), marginCap(w))
}

// noteLatency records in ks that a call answered at now took lat from its
// admission. The longest latency is kept for the current period and the
// one before, so that it covers at least the last period: every send that
// can still be in a window is answered within it when period is the
// longest window plus its margin.
func noteLatency(ks *ledger.KeyState, lat time.Duration, now time.Time, period time.Duration) {
	lat = min(max(lat, 0), MaxMargin)
	switch d := now.Sub(ks.LatencySince); {
	case ks.LatencySince.IsZero() || d >= 2*period:
		ks.PrevLatency, ks.Latency, ks.LatencySince = 0, lat, now
	case d >= period:
		ks.PrevLatency, ks.Latency, ks.LatencySince = ks.Latency, lat, now
	default:
		ks.Latency = max(ks.Latency, lat)
	}
}

// latencyPeriod is how long a latency must be remembered for the windows
// of k and of the policies known for it: the longest of them, with its
// margin.
func latencyPeriod(k *keystore.Key, known []ledger.Known) time.Duration {
	var w time.Duration
	for _, p := range k.Policies {
		w = max(w, p.Window)
	}
	for _, kn := range known {
		if kn.Unit == ratelimit.Requests {
			w = max(w, kn.Window)
		}
	}
	return w + marginCap(w)
}
