package pacer

import (
	"math"
	"net/http"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// Leak-rate learning bounds: two answers closer than minLeakSpan say too
// little about a rate (the bucket's whole-call counts are most of it), and
// no rate is believed above maxLeak per second (the local max_rate caps
// the pace anyway).
const (
	minLeakSpan = 250 * time.Millisecond
	maxLeak     = 1000.0
)

// isLeaky reports whether k is a leaky bucket (ratelimit.ShapeLeaky) with
// what pacing it needs: its size q and drain time w, whose ratio is its
// leak rate.
func isLeaky(k ledger.SeenPolicy) bool {
	return k.Shape == ratelimit.ShapeLeaky && k.Unit == ratelimit.Requests && k.HasQuota && k.Quota > 0 && k.Window > 0 && k.HasRemaining
}

// leakRate is k's leak rate, in calls per second.
func leakRate(k ledger.SeenPolicy) float64 {
	return float64(k.Quota) / k.Window.Seconds()
}

// leaky projects a leaky bucket to now, as a rate: the room it had when
// observed, plus what has leaked out since at its rate (never more than
// the bucket holds), less every call sent since. That is the least room
// the bucket can have — as if every call since went in just now, after
// all the leak — so it never admits a call a full bucket would refuse.
// When there is no room, the next call waits until one more has leaked
// out; a bucket that calls since have filled past its size waits for a
// fresh answer (end, then one probe).
func (s snapshot) leaky(k ledger.SeenPolicy, b Budget, end time.Time) (Budget, constraint, error) {
	var c constraint
	n, err := s.log.Count(k.BasisAt)
	if err != nil {
		return b, c, err
	}
	rate := leakRate(k)
	elapsed := max(s.now.Sub(k.ReceivedAt), 0).Seconds()
	room := min(float64(k.Quota), float64(k.Remaining)+rate*elapsed) - float64(n)
	b.Remaining = max(int64(math.Floor(room)), 0)
	b.Reset = time.Duration(float64(time.Second) / rate) // one call leaks out
	if room >= 1 {
		return b, c, nil
	}
	// One more call fits once n+1-r calls have leaked out since the answer;
	// never, by this answer, when the calls since overfill the bucket.
	next := k.ReceivedAt.Add(time.Duration((float64(n) + 1 - float64(k.Remaining)) / rate * float64(time.Second)))
	if n+1 > int(k.Quota) {
		next = end
	}
	b.Reset = next.Sub(s.now)
	c = constraint{wait: next.Sub(s.now), source: k.Policy, exhaust: true, keyWide: true,
		reason: reason.Reason{Kind: reason.BucketFull, Policy: k.Policy, Limit: k.Quota, Rate: rate, For: next.Sub(s.now)}}
	return b, c, nil
}

// learnLeak sets the leak rate of the leaky-bucket observation ob (its w)
// from what the bucket did since prev, the previous answer about it: the
// room it had then, the calls sent between the two requests (this one
// included) and the room it has now say how much leaked out in between.
// An estimate is taken only from a successful answer at least
// minLeakSpan after prev, about a bucket of the same size that did not
// run empty (then the leak is only a lower bound, kept only when it
// raises the rate); it is averaged with the rate known so far, so that
// one noisy pair of answers moves the pace only halfway. Without an
// estimate, the rate known so far stays.
func learnLeak(v outcomeView, key string, ob ratelimit.Observation, receivedAt, basis time.Time, status int,
	prev *ledger.SeenPolicy) (ratelimit.Observation, error) {
	if prev == nil || !isLeaky(*prev) || !ob.HasQuota || ob.Quota != prev.Quota || !ob.HasRemaining {
		return ob, nil
	}
	rate := leakRate(*prev)
	span := receivedAt.Sub(prev.ReceivedAt)
	if status < http.StatusBadRequest && span >= minLeakSpan && prev.BasisAt.Before(basis) {
		since, err := v.Count(key, prev.BasisAt)
		if err != nil {
			return ob, err
		}
		after, err := v.Count(key, basis)
		if err != nil {
			return ob, err
		}
		sent := since - after
		leaked := float64(prev.Quota-prev.Remaining) + float64(sent) - float64(ob.Quota-ob.Remaining)
		est := leaked / span.Seconds()
		switch emptied := ob.Remaining >= ob.Quota; {
		case est <= 0:
		case emptied && est > rate:
			rate = min(est, maxLeak)
		case !emptied:
			rate = min((rate+est)/2, maxLeak)
		}
	}
	ob.Window = time.Duration(float64(ob.Quota) / rate * float64(time.Second))
	ob.Reset, ob.HasReset = time.Duration(float64(time.Second)/rate), true
	return ob, nil
}
