package testkit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// A Process is a helper process: the test binary started again to do one
// job in a process of its own (a host, a process to kill, a server left
// behind). It is told its job in JSON in an environment variable, runs
// only the tests it is told to (none by default: its TestMain reads the
// job with Job and does it), and talks on its standard streams, a line
// at a time: it reads orders on stdin, whose end asks it to stop, and
// writes what it did on stdout, which the Process keeps. Its stderr is
// the test's. Its methods are safe for concurrent use.
type Process struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser

	mu      sync.Mutex
	lines   []string
	read    int           // the lines Next returned
	ended   bool          // its stdout closed
	changed chan struct{} // closed and replaced when lines or ended change
	done    chan struct{} // closed when it has exited
	err     error         // its exit, once done
}

// Patience bounds every wait for a helper's line: a loaded 2-core
// machine running the race detector is slow, not that slow.
const Patience = time.Minute

// A Spec says how to start a helper process.
type Spec struct {
	// Name names the process in messages.
	Name string
	// Env is the environment variable the job is given in.
	Env string
	// Job is the job, written to Env in JSON; nil gives "null".
	Job any
	// Run is the -test.run pattern of the tests it runs; "" runs none
	// (^$), so that a binary whose TestMain does not do the job does
	// nothing.
	Run string
}

// Start starts the helper process spec describes. It is killed (if still
// running) when tb ends.
func Start(tb testing.TB, spec Spec) *Process {
	tb.Helper()
	SkipShort(tb, "starts a helper process")
	raw, err := json.Marshal(spec.Job)
	if err != nil {
		tb.Fatal(err)
	}
	run := spec.Run
	if run == "" {
		run = "^$"
	}
	cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.count=1", "-test.shuffle=off")
	cmd.Env = append(os.Environ(), spec.Env+"="+string(raw))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	// A pipe of its own rather than StdoutPipe: the process's exit is
	// known even when a process it started keeps its stdout open.
	stdout, w, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdout = w
	err = cmd.Start()
	w.Close()
	if err != nil {
		stdout.Close()
		tb.Fatal(err)
	}
	p := &Process{name: spec.Name, cmd: cmd, stdin: stdin, changed: make(chan struct{}), done: make(chan struct{})}
	go p.keep(stdout)
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(func() {
		p.stdin.Close()
		p.cmd.Process.Kill()
		<-p.done
		stdout.Close()
	})
	return p
}

// Job reads the job of a helper process started with env into job, and
// reports whether this process is one.
func Job(env string, job any) (bool, error) {
	raw, ok := os.LookupEnv(env)
	if !ok {
		return false, nil
	}
	return true, json.Unmarshal([]byte(raw), job)
}

// keep keeps what the process prints until its stdout closes.
func (p *Process) keep(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		p.mu.Lock()
		p.lines = append(p.lines, sc.Text())
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}
	p.mu.Lock()
	p.ended = true
	close(p.changed)
	p.mu.Unlock()
}

// Name is the process's name.
func (p *Process) Name() string { return p.name }

// wait calls look on what the process said so far until look reports it
// is done, or the process ended; it fails tb after Patience.
func (p *Process) wait(tb testing.TB, look func(lines []string, ended bool) bool) {
	tb.Helper()
	timeout := time.After(Patience)
	for {
		p.mu.Lock()
		lines, ended, changed := p.lines, p.ended, p.changed
		p.mu.Unlock()
		if look(lines, ended) || ended {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			tb.Fatalf("helper %s: no line awaited after %v", p.name, Patience)
		}
	}
}

// Await waits for the first line of all the process printed that match
// accepts, and returns it; false when the process ended first.
func (p *Process) Await(tb testing.TB, match func(string) bool) (string, bool) {
	tb.Helper()
	var found string
	ok := false
	p.wait(tb, func(lines []string, _ bool) bool {
		for _, l := range lines {
			if match(l) {
				found, ok = l, true
				return true
			}
		}
		return false
	})
	return found, ok
}

// Next returns the process's next line not returned by Next before; false
// when it ended first.
func (p *Process) Next(tb testing.TB) (string, bool) {
	tb.Helper()
	var line string
	ok := false
	p.wait(tb, func(lines []string, _ bool) bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.read < len(lines) {
			line, ok = lines[p.read], true
			p.read++
		}
		return ok
	})
	return line, ok
}

// Lines returns every line the process printed so far.
func (p *Process) Lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// Order writes line to the process's stdin.
func (p *Process) Order(tb testing.TB, line string) {
	tb.Helper()
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		tb.Fatalf("helper %s: %v", p.name, err)
	}
}

// CloseInput closes the process's stdin: the helper's signal to stop.
func (p *Process) CloseInput() { p.stdin.Close() }

// Wait waits until the process has exited and its stdout has ended, and
// returns how it exited (an *exec.ExitError for a non-zero status); it
// fails tb after Patience.
func (p *Process) Wait(tb testing.TB) error {
	tb.Helper()
	p.wait(tb, func([]string, bool) bool { return false }) // to the end of its stdout
	select {
	case <-p.done:
		return p.err
	case <-time.After(Patience):
		tb.Fatalf("helper %s did not exit within %v", p.name, Patience)
		return nil
	}
}

// Kill ends the process with SIGKILL and waits until it has exited.
func (p *Process) Kill(tb testing.TB) {
	tb.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		tb.Fatal(err)
	}
	<-p.done
}

// String names the process, for messages.
func (p *Process) String() string {
	return fmt.Sprintf("helper %s (pid %d)", p.name, p.cmd.Process.Pid)
}
