package pacer

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// What one key keeps of what its upstream announced is bounded, whatever
// the upstream sends: at most MaxPolicies policies (every partition of
// them and every hidden-limit guess included) and MaxRouteBuckets
// partitions that belong to one route each (Discord's buckets, Slack's
// per-method tiers). Past a bound, what holds calls back least goes first:
// a policy that constrains nothing any more (its observation expired and was
// answered since, and it has no quota over a window), then one that only
// spreads calls (a budget in a unit the log does not count, not
// exhausted), then the one with the most headroom. A policy that still
// binds is folded into the key's policy EvictedPolicy before it goes (see
// fold), which is at least as tight as every policy folded into it: an
// evicted policy never frees a budget it was holding back.
const (
	MaxPolicies     = 32
	MaxRouteBuckets = 256
	// EvictedPolicy names the policy that policies evicted while they
	// still bound are folded into.
	EvictedPolicy = "evicted"
)

// MaxName is the longest policy or partition name kept, in bytes: a
// longer one is cut, and ends with a hash of the whole, so that two long
// names stay two policies.
const MaxName = 128

// boundName returns name within MaxName bytes (see MaxName).
func boundName(name string) string {
	if len(name) <= MaxName {
		return name
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	sum := fmt.Sprintf("~%016x", h.Sum64())
	// Each run of invalid bytes becomes one "?", not nothing: joining what
	// they split could join a credential an upstream split with one to
	// slip it past the scrubber. The name never grows.
	return strings.ToValidUTF8(name[:MaxName-len(sum)], "?") + sum
}

// shapeFolded is the shape of the folded policy: made by mcp-quota, never
// read from an answer.
const shapeFolded ratelimit.Shape = "folded"

// isFolded reports whether k is one of the key's folded policies.
func isFolded(k ledger.SeenPolicy) bool {
	return k.Policy == EvictedPolicy && k.Shape == shapeFolded && k.Partition == ""
}

// routeScoped reports whether kn belongs to the calls of one route only:
// a per-route partition (see routePartition), or a partition of a profile
// whose partitions are buckets of the route that reported them.
func routeScoped(k *keystore.Key, kn ledger.SeenPolicy) bool {
	return strings.HasPrefix(kn.Partition, routePartition("")) || (kn.Partition != "" && k.Profile.PartitionsByRoute())
}

// restraint is how much a kept policy holds calls back at one moment:
// the higher the class, the more; within a class, the less headroom.
type restraint struct {
	class    int       // 0 nothing, 1 spreading only, 2 binding
	headroom float64   // for class 2: the share of its quota left, 1 when unknown
	at       time.Time // when it was last said
}

// restraintOf ranks k at now, answered being the key's latest answer.
func restraintOf(k ledger.SeenPolicy, now, answered time.Time) restraint {
	r := restraint{headroom: 1, at: k.ReceivedAt}
	windowed := k.HasQuota && k.Window > 0 && logCounted(k.Unit)
	concurrent := k.Unit == ratelimit.ConcurrentRequests && k.HasQuota
	live, probing := false, false
	if k.HasRemaining {
		end := k.ReceivedAt.Add(validity(k))
		live = now.Before(end)
		probing = !live && !answered.After(end)
	}
	switch {
	case windowed || concurrent || (live && logCounted(k.Unit)) || (live && k.Remaining <= 0):
		r.class = 2
		switch {
		case live && k.Remaining <= 0:
			r.headroom = 0
		case live && k.HasQuota && k.Quota > 0:
			r.headroom = float64(k.Remaining) / float64(k.Quota)
		}
	case live || probing:
		r.class = 1
	}
	return r
}

// logCounted reports whether sends are subtracted from what the upstream
// said is left in unit u (see observed): calls in requests, the bytes
// they carried in content-bytes.
func logCounted(u ratelimit.Unit) bool {
	return u == ratelimit.Requests || u == "" || u == ratelimit.ContentBytes
}

// foldUnit is the unit of the folded policy a policy in unit u folds
// into: concurrent-requests and content-bytes each into their own, every
// other unit into requests.
func foldUnit(u ratelimit.Unit) ratelimit.Unit {
	if u == ratelimit.ConcurrentRequests || u == ratelimit.ContentBytes {
		return u
	}
	return ratelimit.Requests
}

// evictions returns which of rows go so that at most max stay, the least
// restrictive at now first (the oldest observation among equals), answered being
// the key's latest answer. Rows must not hold a folded policy.
func evictions(rows []ledger.SeenPolicy, max int, now, answered time.Time) []ledger.SeenPolicy {
	if len(rows) <= max {
		return nil
	}
	type ranked struct {
		k ledger.SeenPolicy
		r restraint
	}
	rs := make([]ranked, len(rows))
	for i, k := range rows {
		rs[i] = ranked{k, restraintOf(k, now, answered)}
	}
	slices.SortStableFunc(rs, func(a, b ranked) int {
		return cmp.Or(cmp.Compare(a.r.class, b.r.class), -cmp.Compare(a.r.headroom, b.r.headroom), a.r.at.Compare(b.r.at))
	})
	out := make([]ledger.SeenPolicy, len(rows)-max)
	for i := range out {
		out[i] = rs[i].k
	}
	return out
}

// fold returns into (a folded policy of v's key, or the zero SeenPolicy when
// there is none yet) made at least as tight at every moment as v too, as
// of now: count returns how many calls of the key were admitted after a
// time (in a folded policy of content-bytes, how many bytes they
// carried).
//
//   - A quota over a window (q, w) in requests folds into the least quota
//     over the longest window: at most min q calls in any max w holds at
//     most q in any w of each. (A leaky bucket's too: a sliding window of
//     its size over its drain time admits no more than the bucket.)
//   - A live observation (r, t) folds into the least of what each has left now,
//     its sends subtracted, until the latest of their ends: from now on
//     every send is subtracted from it, so it admits no more than any of
//     them would have, until each would have expired — and some while
//     after. An observation in a unit the log does not count holds calls back
//     only when it is exhausted: it folds as nothing left in requests.
//   - A limit on calls in flight folds into the least of them.
//   - Policies in content-bytes fold as those in requests do, into a
//     folded policy of their own, their sends counted in bytes.
//
// Anything else v says constrains nothing at now, and is dropped.
func fold(into, v ledger.SeenPolicy, now time.Time, count func(since time.Time) (int64, error)) (ledger.SeenPolicy, error) {
	c := into
	if c.Policy == "" {
		unit := foldUnit(v.Unit)
		c = ledger.SeenPolicy{Key: v.Key, ReceivedAt: now, BasisAt: now,
			Observation: ratelimit.Observation{Policy: EvictedPolicy, Unit: unit, Shape: shapeFolded}}
	}
	if c.Unit == ratelimit.ConcurrentRequests {
		if v.Unit == ratelimit.ConcurrentRequests && v.HasQuota {
			c.Quota, c.HasQuota = minKnown(c.Quota, c.HasQuota, v.Quota), true
		}
		return c, nil
	}
	if v.HasQuota && v.Window > 0 && logCounted(v.Unit) && foldUnit(v.Unit) == c.Unit {
		c.Quota, c.HasQuota = minKnown(c.Quota, c.HasQuota, v.Quota), true
		c.Window = max(c.Window, v.Window)
	}
	left, end, ok, err := leftNow(v, now, count)
	if err != nil || !ok {
		return c, err
	}
	if l, e, ok, err := leftNow(c, now, count); err != nil {
		return c, err
	} else if ok {
		left, end = min(left, l), maxTime(end, e)
	}
	c.Remaining, c.HasRemaining = max(left, 0), true
	c.Reset, c.HasReset = end.Sub(now), true
	c.ReceivedAt, c.BasisAt = now, now
	return c, nil
}

// leftNow is what k's live observation has left at now in requests, and when it
// expires; ok is false when k has no live observation that holds calls back.
func leftNow(k ledger.SeenPolicy, now time.Time, count func(since time.Time) (int64, error)) (left int64, end time.Time, ok bool, err error) {
	if !k.HasRemaining {
		return 0, end, false, nil
	}
	end = k.ReceivedAt.Add(validity(k))
	if !now.Before(end) {
		return 0, end, false, nil
	}
	if !logCounted(k.Unit) {
		return 0, end, k.Remaining <= 0, nil
	}
	n, err := count(k.BasisAt)
	return k.Remaining - n, end, err == nil, err
}

func minKnown(a int64, has bool, b int64) int64 {
	if !has {
		return b
	}
	return min(a, b)
}

// full reports whether known, what the state keeps of k, is at one of
// its bounds: one policy more may call for an eviction (see bound).
func full(k *keystore.Key, known []ledger.SeenPolicy) bool {
	plain, scoped := 0, 0
	for _, kn := range known {
		switch {
		case isFolded(kn):
		case routeScoped(k, kn):
			scoped++
		default:
			plain++
		}
	}
	return plain >= MaxPolicies || scoped >= MaxRouteBuckets
}

// bound plans to keep what v holds of k within the bounds at now,
// answered being the key's latest answer: the policies evicted, folded
// into the key's EvictedPolicy, and the warning to show when it reached a
// bound for the first time.
func bound(v outcomeView, k *keystore.Key, now, answered time.Time) (outcomePlan, error) {
	var part outcomePlan
	known, err := v.SeenPolicies(k.Name)
	if err != nil {
		return part, err
	}
	plain, scoped, folded := groupSeen(k, known)
	victims := append(evictions(plain, MaxPolicies, now, answered), evictions(scoped, MaxRouteBuckets, now, answered)...)
	if len(victims) == 0 {
		return part, nil
	}
	first := len(folded) == 0
	changed, err := evict(v, k, victims, folded, now)
	if err != nil {
		return part, err
	}
	part.seen = changed.seen
	if first {
		changed.units[ratelimit.Requests] = true // the first fold marks that the bound was reached
	}
	part.seen = append(part.seen, putFolds(v, k, folded, changed.units, now)...)
	if !first {
		return part, nil
	}
	msg := reason.Reason{Kind: reason.PolicyBound, Key: k.Name, Limit: MaxPolicies, Buckets: MaxRouteBuckets, Policy: EvictedPolicy}
	return raise(part, k.Name, now, ledger.PolicyBoundWarning, msg), nil
}

// groupSeen sorts what the state keeps of k into plain policies, the
// partitions that belong to one route each, and the folds of policies
// evicted before (see fold), by unit.
func groupSeen(k *keystore.Key, known []ledger.SeenPolicy) (plain, scoped []ledger.SeenPolicy, folded map[ratelimit.Unit]ledger.SeenPolicy) {
	folded = map[ratelimit.Unit]ledger.SeenPolicy{}
	for _, kn := range known {
		switch {
		case isFolded(kn):
			folded[kn.Unit] = kn
		case routeScoped(k, kn):
			scoped = append(scoped, kn)
		default:
			plain = append(plain, kn)
		}
	}
	return plain, scoped, folded
}

// An eviction is what evict decided: the policies to delete, and the
// units whose fold changed.
type eviction struct {
	seen  []seenChange
	units map[ratelimit.Unit]bool
}

// evict deletes each of victims, folding it first into folded's policy of
// its unit (folded is updated), and returns the deletions and the units
// whose fold changed.
func evict(v outcomeView, k *keystore.Key, victims []ledger.SeenPolicy, folded map[ratelimit.Unit]ledger.SeenPolicy, now time.Time) (eviction, error) {
	e := eviction{units: map[ratelimit.Unit]bool{}}
	for _, vic := range victims {
		unit := foldUnit(vic.Unit)
		f, err := fold(folded[unit], vic, now, counter(v, k.Name, unit))
		if err != nil {
			return e, err
		}
		folded[unit], e.units[unit] = f, true
		e.seen = append(e.seen, deleteSeen(vic))
	}
	return e, nil
}

// putFolds returns the writes of the folds of the changed units, each
// replacing the one before whole (what that held is in its new values); a
// unit without one gets an empty fold, at now.
func putFolds(v outcomeView, k *keystore.Key, folded map[ratelimit.Unit]ledger.SeenPolicy, changed map[ratelimit.Unit]bool, now time.Time) []seenChange {
	var out []seenChange
	for unit := range changed {
		f, had := folded[unit]
		if !had {
			f, _ = fold(ledger.SeenPolicy{}, ledger.SeenPolicy{Key: k.Name, Observation: ratelimit.Observation{Unit: unit}}, now, counter(v, k.Name, unit))
		}
		out = append(out, deleteSeen(ledger.SeenPolicy{Key: k.Name, Observation: ratelimit.Observation{Policy: EvictedPolicy, Unit: unit}}),
			putSeen(f))
	}
	return out
}

// counter counts what v's log holds of key's unit since a time: bytes
// for ContentBytes, calls for every other unit.
func counter(v outcomeView, key string, unit ratelimit.Unit) func(since time.Time) (int64, error) {
	if unit == ratelimit.ContentBytes {
		return func(since time.Time) (int64, error) { return v.Bytes(key, since) }
	}
	return func(since time.Time) (int64, error) {
		n, err := v.Count(key, since)
		return int64(n), err
	}
}
