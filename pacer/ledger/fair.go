package ledger

import "time"

// Fair is what a key's shares need across hosts: how much of a window
// each principal spent, and which principals have calls waiting for the
// key, on any host.
type Fair interface {
	// PrincipalWindow returns, for each of principals with an admission
	// of key after since recorded with Attempt.Principal, how many and
	// the oldest, at a cost that grows with the principals asked about,
	// not with the calls the window holds. Admissions recorded without a
	// principal (slots of a lease, calls made before the key had shares)
	// are not counted.
	PrincipalWindow(key string, since time.Time, principals []string) (map[string]Use, error)
	// Waiting returns the principals with calls of key waiting at now, on
	// any host, once each, in no particular order.
	Waiting(key string, now time.Time) ([]string, error)
	// Wait records that principal has calls of key waiting in waiter (a
	// name each process's pacer draws for itself) until until, in place of
	// what waiter recorded before (until now ends the record), and forgets
	// every record of key that ran out before now (a process that ended
	// while its calls waited): a key holds at most one record per
	// principal and live waiter.
	Wait(key, principal, waiter string, now, until time.Time) error
}

// A Use is what one principal spent of a key's window.
type Use struct {
	Count  int       // admissions
	Oldest time.Time // the oldest of them
}
