//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package state

import (
	"fmt"
	"os"
	"syscall"
)

// journaling says the journal can be used here.
const journaling = true

// lockFile takes f's exclusive lock, without waiting: it fails while
// another open file holds it, in this process or another. The system
// releases it when the file is closed, or its process ends.
func lockFile(f *os.File) error {
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return fmt.Errorf("state: lock %s: %w", f.Name(), err)
	}
	return nil
}
