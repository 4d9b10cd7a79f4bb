package ledger

import "time"

// A Use is what one principal spent of a key's window (see
// Reader.PrincipalWindow).
type Use struct {
	Count  int       // admissions
	Oldest time.Time // the oldest of them
}
