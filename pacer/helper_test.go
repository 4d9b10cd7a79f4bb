package pacer_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/state"
)

// The helper process: the test binary re-executed with helperEnv set runs
// TestHelperProcess, which hammers one key of a state file shared with its
// parent and other helpers, and reports on stdout.
//
// Protocol: the helper prints "ready" once its state file is open, then
// one line "admitted ID" per admission it committed (after the admission's
// transaction), and ends when its stdin closes or its run time is up,
// printing "done N" with the number of calls it had admitted.
const helperEnv = "PACER_TEST_HELPER"

// helperConfig is what a helper process is told through its environment.
type helperConfig struct {
	Path      string        // the state file, or a PostgreSQL URL (its password in PGPASSWORD)
	Caller    string        // the caller name it uses
	Quota     int64         // the key's documented policy
	Window    time.Duration // (none when Quota is 0)
	Run       time.Duration // stop after this long; 0 means when stdin closes
	Stuck     bool          // admit one call first and never finish it
	Lease     time.Duration
	AdmitOnly bool // measure Admit alone (no Done)
	Quiet     bool // do not print every admission
}

func (c helperConfig) env() []string {
	return append(os.Environ(), helperEnv+"=1",
		"PACER_PATH="+c.Path, "PACER_CALLER="+c.Caller,
		"PACER_QUOTA="+strconv.FormatInt(c.Quota, 10), "PACER_WINDOW="+c.Window.String(),
		"PACER_RUN="+c.Run.String(), "PACER_STUCK="+strconv.FormatBool(c.Stuck),
		"PACER_LEASE="+c.Lease.String(), "PACER_ADMIT_ONLY="+strconv.FormatBool(c.AdmitOnly),
		"PACER_QUIET="+strconv.FormatBool(c.Quiet))
}

func helperConfigFromEnv() (helperConfig, error) {
	var c helperConfig
	var err error
	parseDur := func(name string) time.Duration {
		d, e := time.ParseDuration(os.Getenv(name))
		err = errors.Join(err, e)
		return d
	}
	c.Path, c.Caller = os.Getenv("PACER_PATH"), os.Getenv("PACER_CALLER")
	c.Quota, err = strconv.ParseInt(os.Getenv("PACER_QUOTA"), 10, 64)
	c.Window, c.Run, c.Lease = parseDur("PACER_WINDOW"), parseDur("PACER_RUN"), parseDur("PACER_LEASE")
	c.Stuck = os.Getenv("PACER_STUCK") == "true"
	c.AdmitOnly = os.Getenv("PACER_ADMIT_ONLY") == "true"
	c.Quiet = os.Getenv("PACER_QUIET") == "true"
	return c, err
}

// hammerKey is the key helpers and benchmarks share: no local safety limit
// gets in the way, so only the documented policy (if any) binds.
func hammerKey(quota int64, window time.Duration) *keystore.Key {
	k := &keystore.Key{Name: "shared", MaxRate: 1e9, MaxConcurrency: 1 << 20, LowWater: 0}
	if quota > 0 {
		k.Policies = []keystore.Policy{{Name: "default", Quota: quota, Window: window, Unit: ratelimit.Requests}}
	}
	return k
}

func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("run as a helper process by other tests")
	}
	err := runHelper()
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runHelper() error {
	cfg, err := helperConfigFromEnv()
	if err != nil {
		return err
	}
	ctx := context.Background()
	db, err := state.OpenStore(ctx, cfg.Path, state.PostgresOptions{JournalDir: os.Getenv("PACER_JOURNAL")})
	if err != nil {
		return err
	}
	defer db.Close()
	p := pacer.New(db)
	if pg, ok := db.(*state.Postgres); ok {
		p.Now = pg.Now
	}
	p.Lease = cfg.Lease
	key := hammerKey(cfg.Quota, cfg.Window)
	out := bufio.NewWriter(os.Stdout)
	stop := make(chan struct{})
	go func() { // stdin closing is the signal to stop
		io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	var deadline <-chan time.Time
	if cfg.Run > 0 {
		deadline = time.After(cfg.Run)
	}
	call := func(n int) (pacer.Ticket, error) {
		return p.Admit(ctx, pacer.Call{Key: key, Caller: cfg.Caller, Transport: "rest", Method: "GET",
			Target: "/items", CallID: fmt.Sprintf("%s-%d", cfg.Caller, n), Attempt: 1, MaxWait: time.Second})
	}
	if cfg.Stuck {
		t, err := call(0)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "stuck %d\n", t.ID)
	}
	fmt.Fprintln(out, "ready")
	out.Flush()
	n := 0 // admissions
	for i := 1; ; i++ {
		if ended(stop, deadline) {
			if err := p.Close(ctx); err != nil { // its leases' unused slots
				return err
			}
			fmt.Fprintf(out, "done %d\n", n)
			return out.Flush()
		}
		t, err := call(i)
		if errors.Is(err, pacer.ErrPaused) {
			continue
		}
		if err != nil {
			return err
		}
		n++
		if !cfg.Quiet {
			fmt.Fprintf(out, "admitted %d\n", t.ID)
			out.Flush()
		}
		if cfg.AdmitOnly {
			continue
		}
		now := time.Now()
		if _, err := p.Done(ctx, t, pacer.Outcome{SentAt: now, AnsweredAt: now, Status: 200}); err != nil {
			return err
		}
	}
}

// ended reports whether stop is closed or deadline has passed.
func ended(stop <-chan struct{}, deadline <-chan time.Time) bool {
	select {
	case <-stop:
		return true
	case <-deadline:
		return true
	default:
		return false
	}
}

// helper is a running helper process.
type helper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
}

// startHelper starts a helper process and waits for it to be ready; it
// returns the ID of its stuck call when cfg.Stuck.
func startHelper(tb testing.TB, cfg helperConfig) (*helper, int64) {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.shuffle=off")
	cmd.Env = cfg.env()
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	h := &helper{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout)}
	tb.Cleanup(func() {
		h.stdin.Close()
		if h.cmd.ProcessState == nil {
			h.cmd.Process.Kill()
			h.cmd.Wait()
		}
	})
	var stuck int64
	for {
		line, ok := h.next()
		if !ok {
			tb.Fatalf("helper %s ended before it was ready", cfg.Caller)
		}
		if id, ok := strings.CutPrefix(line, "stuck "); ok {
			stuck, _ = strconv.ParseInt(id, 10, 64)
		}
		if line == "ready" {
			return h, stuck
		}
	}
}

// next returns the helper's next line of output.
func (h *helper) next() (string, bool) {
	if !h.lines.Scan() {
		return "", false
	}
	return h.lines.Text(), true
}

// admitted returns the ID of the helper's next committed admission, or
// false when it printed "done" or ended.
func (h *helper) admitted() (int64, bool) {
	for {
		line, ok := h.next()
		if !ok || strings.HasPrefix(line, "done ") {
			return 0, false
		}
		if id, ok := strings.CutPrefix(line, "admitted "); ok {
			n, err := strconv.ParseInt(id, 10, 64)
			return n, err == nil
		}
	}
}

// stop asks the helper to end and returns how many calls it made.
func (h *helper) stop(tb testing.TB) int {
	tb.Helper()
	h.stdin.Close()
	return h.wait(tb)
}

// wait waits for the helper to end and returns how many calls it made.
func (h *helper) wait(tb testing.TB) int {
	tb.Helper()
	n := -1
	for {
		line, ok := h.next()
		if !ok {
			break
		}
		if v, ok := strings.CutPrefix(line, "done "); ok {
			n, _ = strconv.Atoi(v)
		}
	}
	if err := h.cmd.Wait(); err != nil {
		tb.Fatalf("helper: %v", err)
	}
	return n
}
