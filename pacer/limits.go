package pacer

// An OwnLimit is one of the pacer's own limits that can hold a call back:
// the key's pace, its most calls at once, a probe out for a fresh answer,
// a principal's share or turn. It is never a policy's name: a policy named
// "pace" is a budget, not the pacer's pace. The zero OwnLimit is none of
// them (a policy or a gate binds).
type OwnLimit string

// The pacer's own limits.
const (
	PaceLimit        OwnLimit = "pace"        // calls are spaced (the key's pace, or slow start)
	ConcurrencyLimit OwnLimit = "concurrency" // the key's most calls at once are in flight
	ProbeLimit       OwnLimit = "probe"       // a probe is out, and calls wait for its answer
	ShareLimit       OwnLimit = "share"       // the caller's principal has spent its share
	TurnLimit        OwnLimit = "turn"        // principals further behind go first
)
