package ratelimit

import (
	"fmt"
	"strings"
	"time"
)

// rank orders shapes by authority: the draft-11 fields first, then the
// older draft shapes, then vendor fields.
func rank(s Shape) int {
	switch s {
	case ShapeDraft:
		return 0
	case ShapeDraft07:
		return 1
	case ShapeDraft03:
		return 2
	case ShapeVendor:
		return 3
	}
	return 4
}

// merge folds an observation of an older or vendor shape into the one
// observation of a more authoritative shape that describes the same
// policy in the same response, so that one policy is not counted twice.
// The match must be unambiguous: the one candidate with the same quota,
// or else the only candidate (same unit, compatible partition) when one
// of the two states no quota; two different quotas are two policies. The
// merged observation keeps the stricter of each value (lower quota and
// remaining, longer window and reset), with a warning when they disagree
// (resets within a second of each other agree: one is often rounded). An
// ambiguous observation is kept apart, with a warning.
func (rd *reader) merge() {
	removed := make([]bool, len(rd.entries))
	for i := range rd.entries {
		e := &rd.entries[i]
		if !e.mergeable {
			continue
		}
		var all, sameQuota []int
		for j := range rd.entries {
			t := &rd.entries[j]
			if j == i || removed[j] || rank(t.Shape) >= rank(e.Shape) || t.Unit != e.Unit ||
				(e.Partition != "" && t.Partition != e.Partition) {
				continue
			}
			all = append(all, j)
			if e.HasQuota && t.HasQuota && t.Quota == e.Quota {
				sameQuota = append(sameQuota, j)
			}
		}
		target := -1
		switch {
		case len(sameQuota) == 1:
			target = sameQuota[0]
		case len(all) == 1 && e.HasQuota && rd.entries[all[0]].HasQuota:
			rd.warnf("%s states quota %d, %s states %d: different policies, kept apart",
				describe(e.Observation), e.Quota, describe(rd.entries[all[0]].Observation), rd.entries[all[0]].Quota)
		case len(all) == 1:
			target = all[0]
		case len(all) > 1:
			rd.warnf("%s could not be matched to one of %d policies; kept as a separate observation", describe(e.Observation), len(all))
		}
		if target < 0 {
			continue
		}
		rd.mergeInto(&rd.entries[target], e.Observation)
		removed[i] = true
	}
	kept := rd.entries[:0]
	for i, e := range rd.entries {
		if !removed[i] {
			kept = append(kept, e)
		}
	}
	rd.entries = kept
}

// mergeInto merges e into t, an observation of the same policy: the
// stricter of two values (less quota or less remaining, a longer window
// or a later reset) is kept, and a warning names the values on which
// they disagree.
func (rd *reader) mergeInto(t *entry, e Observation) {
	var diffs []string
	if t.HasQuota && e.HasQuota && t.Quota != e.Quota {
		diffs = append(diffs, fmt.Sprintf("quota %d vs %d", t.Quota, e.Quota))
		t.Quota = min(t.Quota, e.Quota)
	} else if e.HasQuota && !t.HasQuota {
		t.Quota, t.HasQuota = e.Quota, true
	}
	if t.Window > 0 && e.Window > 0 && t.Window != e.Window {
		diffs = append(diffs, fmt.Sprintf("window %v vs %v", t.Window, e.Window))
	}
	t.Window = max(t.Window, e.Window)
	if t.HasRemaining && e.HasRemaining && t.Remaining != e.Remaining {
		diffs = append(diffs, fmt.Sprintf("remaining %d vs %d", t.Remaining, e.Remaining))
		t.Remaining = min(t.Remaining, e.Remaining)
	} else if e.HasRemaining && !t.HasRemaining {
		t.Remaining, t.HasRemaining = e.Remaining, true
	}
	if t.HasReset && e.HasReset {
		if d := t.Reset - e.Reset; d > time.Second || d < -time.Second {
			diffs = append(diffs, fmt.Sprintf("reset %v vs %v", t.Reset, e.Reset))
		}
		t.Reset = max(t.Reset, e.Reset)
	} else if e.HasReset {
		t.Reset, t.HasReset = e.Reset, true
	}
	t.Guessed = t.Guessed || e.Guessed
	if len(diffs) > 0 {
		rd.warnf("%s and %s disagree (%s); the stricter values are kept",
			describe(t.Observation), describe(e), strings.Join(diffs, ", "))
	}
}

// describe names the fields an observation was read from, for warnings.
func describe(o Observation) string {
	var s string
	switch o.Shape {
	case ShapeDraft:
		s = "RateLimit"
	case ShapeDraft07:
		s = "RateLimit (draft-07)"
	case ShapeDraft03:
		s = "RateLimit-Limit/-Remaining/-Reset"
	case ShapeVendor:
		s = fmt.Sprintf("X-RateLimit-* (%s)", o.Profile)
	default:
		s = string(o.Shape)
	}
	if o.Policy != "" {
		s += " policy " + quote(o.Policy)
	}
	return s
}
