// Package spelling suggests the name a person most likely meant when a
// name they typed (a flag, a command, a configuration field, a profile)
// is unknown.
package spelling

// Closest returns the candidate nearest to name by edit distance, if it
// is close enough to be a likely misspelling: at most 2 edits, and fewer
// edits than the name has letters. It returns "" when none is.
func Closest(name string, candidates []string) string {
	best, dist := "", min(3, len(name))
	for _, c := range candidates {
		if d := Distance(name, c); d < dist {
			best, dist = c, d
		}
	}
	return best
}

// Distance is the Levenshtein distance between a and b, in bytes: the
// fewest insertions, deletions and substitutions that turn a into b.
func Distance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
