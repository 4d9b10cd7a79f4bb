//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package state

import "os"

// journaling says the journal can be used here: it cannot.
const journaling = false

// lockFile cannot lock here: the journal is not used, and outcomes are
// recorded at once.
func lockFile(*os.File) error { return errNoJournal }
