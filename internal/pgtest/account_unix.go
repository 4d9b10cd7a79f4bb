//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package pgtest

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"
)

// account is who runs initdb, postgres and pg_ctl: the current user, or,
// when that is root (PostgreSQL refuses to run as root), the postgres user.
// The zero account is the current user.
type account struct {
	cred *syscall.Credential // nil: the current user
}

// serverAccount returns the account servers run as here.
func serverAccount() (account, error) {
	if os.Geteuid() != 0 {
		return account{}, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return account{}, fmt.Errorf("no postgres user to run PostgreSQL as (this is root, which PostgreSQL refuses): %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return account{}, fmt.Errorf("postgres user's uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return account{}, fmt.Errorf("postgres user's gid %q: %w", u.Gid, err)
	}
	return account{cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}, nil
}

// command returns a command run as a, in dir, in a process group of its own
// (so a terminal's ^C reaches this process, whose watchers then clean up,
// and not the server in the middle of that), with no PG* variables in its
// environment (PGPORT, PGDATA and the like would override the flags).
func (a account) command(dir, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: a.cred, Setpgid: true}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	return cmd
}

// own makes path a's, when a is not the current user.
func (a account) own(path string) error {
	if a.cred == nil {
		return nil
	}
	return os.Lchown(path, int(a.cred.Uid), int(a.cred.Gid))
}

// A watcher is a shell, run as some account, that waits for this process
// to end (however it ends: a test timeout, a panic, a SIGKILL, ^C) and then
// runs a script that cleans up after it. It waits for the end of its
// standard input, a pipe whose write end only this process holds; so the
// watcher must stay reachable until stopped (a collected *os.File closes
// itself).
type watcher struct {
	cmd  *exec.Cmd
	pipe io.Closer
}

// watch starts a watcher as a, in dir, for script; args are the script's
// $1, $2 and so on.
func (a account) watch(dir, script string, args ...string) (*watcher, error) {
	cmd := a.command(dir, "/bin/sh", append([]string{"-c", "read -r _; " + script, "sh"}, args...)...)
	pipe, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start a watcher: %w", err)
	}
	return &watcher{cmd: cmd, pipe: pipe}, nil
}

// stop ends w without running its script.
func (w *watcher) stop() {
	w.cmd.Process.Kill()
	w.cmd.Wait() // killed: the status says nothing
	w.pipe.Close()
}
