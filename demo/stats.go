package demo

import (
	"slices"
	"time"
)

// Stats is what the demo API saw for one key. The zero value is a key
// that sent nothing.
type Stats struct {
	// Requests counts every request that reached the API with the key's
	// valid token, accepted or refused.
	Requests int
	// Accepted holds the times of the calls counted against the limit, in
	// order. Every request the limit admitted is here, whatever its
	// status: 304 Not Modified still counts, and so do 400 and 404.
	Accepted []time.Time
	// Rejected counts refusals for the rate limit (429, or GitHubStyle's
	// 403); refused calls are not in Accepted.
	Rejected int
}

// MaxInWindow returns the most accepted calls in any rolling window of
// length w: the largest number of times in Accepted that fall in one
// half-open interval [t, t+w). It is 0 for w <= 0.
func (s Stats) MaxInWindow(w time.Duration) int {
	if w <= 0 {
		return 0
	}
	ts := s.Accepted
	if !slices.IsSortedFunc(ts, time.Time.Compare) {
		ts = slices.SortedFunc(slices.Values(ts), time.Time.Compare)
	}
	best, j := 0, 0
	for i := range ts {
		end := ts[i].Add(w)
		for j < len(ts) && ts[j].Before(end) {
			j++
		}
		best = max(best, j-i)
	}
	return best
}
