package testkit

import "time"

// MostIn returns the most of times (sorted, oldest first) in any window
// of length w: in (t-w, t], as a window counts the admissions after its
// start. It judges a promise about a rolling window.
func MostIn(times []time.Time, w time.Duration) int {
	most, lo := 0, 0
	for i, t := range times {
		for !times[lo].After(t.Add(-w)) {
			lo++
		}
		most = max(most, i-lo+1)
	}
	return most
}
