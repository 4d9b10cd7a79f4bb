//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package pgtest

import (
	"errors"
	"os/exec"
)

// account would be who runs the server's processes: here there is none,
// so every Start skips (or, under CI=true, fails).
type account struct{}

func serverAccount() (account, error) {
	return account{}, errors.New("no throwaway PostgreSQL servers on this system (pgtest needs Unix)")
}

func (account) command(dir, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	return cmd
}

func (account) own(string) error { return nil }

type watcher struct{}

func (account) watch(string, string, ...string) (*watcher, error) {
	return nil, errors.ErrUnsupported
}

func (*watcher) stop() {}
