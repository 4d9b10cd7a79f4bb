package conformance

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/state"
)

// A helper process is the test binary started again with helperEnv set
// to its job (a helperJob in JSON): TestMain calls RunHelper, which does
// the job instead of running the tests. It opens the store as every
// process does, admits calls through a real pacer, and reports on stdout,
// one line each:
//
//	stuck ID           (victim) a call admitted first and never finished
//	reserved FIRST LAST (victim) slots of key "leased" it holds
//	ready              its store is open
//	admitted ID        a committed admission (unless Quiet)
//	finished ID        (victim) FinishLater returned for slot ID, asked by "finish ID" on stdin
//	done N             it stopped (stdin closed, or Run is up) after N admissions
const helperEnv = "STATE_CONFORMANCE_HELPER"

// A helperJob is what a helper process is asked to do.
type helperJob struct {
	Location   string        // the store, as state.OpenStore opens it
	JournalDir string        // the journals' directory (PostgresOptions.JournalDir)
	Caller     string        // the caller name its calls have
	Quota      int64         // key "shared"'s documented policy: Quota calls…
	Window     time.Duration // …per Window
	Lease      time.Duration // the pacer's lease (Pacer.Lease)
	Run        time.Duration // stop after this long; 0 means once stdin closes
	Quiet      bool          // do not report each admission
	Victim     bool          // admit one call first and never finish it, hold slots, and take "finish" orders
}

// RunHelper does a helper process's job, and exits, when the test binary
// was started as one by the suite's multi-process tests; otherwise it
// returns at once. A test binary that runs the suite calls it first in
// its TestMain.
func RunHelper() {
	raw := os.Getenv(helperEnv)
	if raw == "" {
		return
	}
	var job helperJob
	err := json.Unmarshal([]byte(raw), &job)
	if err == nil {
		err = job.run(context.Background())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// sharedKey is the key the helpers admit calls of: no local safety limit
// gets in the way, so only the documented policy binds.
func sharedKey(quota int64, window time.Duration) *keystore.Key {
	return &keystore.Key{Name: "shared", MaxRate: 1e9, MaxConcurrency: 1 << 20, LowWater: 0,
		Policies: []keystore.Policy{{Name: "default", Quota: quota, Window: window, Unit: ratelimit.Requests}}}
}

// victimSlots is how many slots of key "leased" a victim reserves.
const victimSlots = 6

// slotOutcome is the end of the call of key "leased"'s slot id.
func slotOutcome(id int64, at time.Time) ledger.Finished {
	return ledger.Finished{
		Attempt: ledger.Attempt{ID: id, Key: "leased", CallID: fmt.Sprint("slot-", id), Attempt: 1, Caller: "victim",
			Transport: "rest", Method: "GET", Target: "/items", State: ledger.Confirmed, Reason: "HTTP 200 OK", Status: 200,
			SentAt: at, AnsweredAt: at},
		Observations: []ledger.ObservationRecord{{Key: "leased", AttemptID: id, Status: 200, ReceivedAt: at, Method: "GET", Target: "/items",
			Observation: ratelimit.Observation{Policy: "default", Unit: ratelimit.Requests, Remaining: 7, HasRemaining: true, Shape: ratelimit.ShapeDraft}}},
	}
}

func (job helperJob) run(ctx context.Context) error {
	s, err := state.OpenStore(ctx, job.Location, state.PostgresOptions{JournalDir: job.JournalDir})
	if err != nil {
		return err
	}
	defer s.Close()
	p := pacer.New(s)
	if pg, ok := s.(*state.Postgres); ok {
		p.Now = pg.Now // the server's clock, which admissions are recorded by
	}
	p.Lease = job.Lease
	key := sharedKey(job.Quota, job.Window)
	var mu sync.Mutex // the lines of stdout
	out := bufio.NewWriter(os.Stdout)
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
		out.Flush()
	}
	call := func(n int) (pacer.Ticket, error) {
		return p.Admit(ctx, pacer.Call{Key: key, Caller: job.Caller, Transport: "rest", Method: "GET",
			Target: "/items", CallID: fmt.Sprintf("%s-%d", job.Caller, n), Attempt: 1, MaxWait: time.Second})
	}
	if job.Victim {
		t, err := call(0)
		if err != nil {
			return err
		}
		say("stuck %d", t.ID)
		var first, last int64
		err = s.Update(ctx, func(tx ledger.Tx) error {
			at := tx.Clock(time.Now())
			first, last, err = tx.Reserve("leased", victimSlots, at, at.Add(job.Lease), "a batch")
			return err
		}, "leased")
		if err != nil {
			return err
		}
		say("reserved %d %d", first, last)
	}
	stop := make(chan struct{})
	go func() { // lines on stdin are orders, done beside the calls; its end, the signal to stop
		defer close(stop)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			id, err := strconv.ParseInt(strings.TrimPrefix(sc.Text(), "finish "), 10, 64)
			if err == nil {
				err = s.FinishLater(ctx, slotOutcome(id, time.Now()))
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "conformance helper: order %q: %v\n", sc.Text(), err)
				os.Exit(1)
			}
			say("finished %d", id)
		}
	}()
	var deadline <-chan time.Time
	if job.Run > 0 {
		deadline = time.After(job.Run)
	}
	say("ready")
	n := 0 // admissions
	for i := 1; ; i++ {
		select {
		case <-stop:
			return job.finish(ctx, p, say, n)
		case <-deadline:
			return job.finish(ctx, p, say, n)
		default:
		}
		t, err := call(i)
		if errors.Is(err, pacer.ErrPaused) {
			continue
		}
		if err != nil {
			return err
		}
		n++
		if !job.Quiet {
			say("admitted %d", t.ID)
		}
		now := time.Now()
		if _, err := p.Done(ctx, t, pacer.Outcome{SentAt: now, AnsweredAt: now, Status: 200}); err != nil {
			return err
		}
	}
}

// finish gives back the pacer's unused slots and reports the admissions.
func (job helperJob) finish(ctx context.Context, p *pacer.Pacer, say func(string, ...any), n int) error {
	if err := p.Close(ctx); err != nil {
		return err
	}
	say("done %d", n)
	return nil
}

// A helper is a running helper process, and what it said so far.
type helper struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser

	mu      sync.Mutex
	lines   []string
	ended   bool          // its stdout closed
	changed chan struct{} // closed and replaced when lines or ended change
}

// startHelper starts a helper process doing job and waits until it is
// ready.
func startHelper(t *testing.T, b Backend, job helperJob) *helper {
	t.Helper()
	job.JournalDir = b.JournalDir(job.Location)
	raw, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	// -test.run matches no test: a binary whose TestMain does not call
	// RunHelper runs nothing, and says no "ready".
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{name: job.Caller, cmd: cmd, stdin: stdin, changed: make(chan struct{})}
	go h.read(stdout)
	t.Cleanup(func() {
		h.stdin.Close()
		h.cmd.Process.Kill()
		h.cmd.Wait()
	})
	if _, ok := h.await(t, func(l string) bool { return l == "ready" }); !ok {
		t.Fatalf("helper %s ended before it was ready (does the test binary's TestMain call conformance.RunHelper?)", h.name)
	}
	return h
}

// read keeps what the helper prints, until its stdout closes.
func (h *helper) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		h.mu.Lock()
		h.lines = append(h.lines, sc.Text())
		close(h.changed)
		h.changed = make(chan struct{})
		h.mu.Unlock()
	}
	h.mu.Lock()
	h.ended = true
	close(h.changed)
	h.mu.Unlock()
}

// helperPatience bounds every wait for a helper's line: a loaded 2-core
// machine running the race detector is slow, not that slow.
const helperPatience = time.Minute

// await waits for the helper's first line that match accepts and returns
// it; false when the helper ended first.
func (h *helper) await(t *testing.T, match func(string) bool) (string, bool) {
	t.Helper()
	timeout := time.After(helperPatience)
	for seen := 0; ; {
		h.mu.Lock()
		lines, ended, changed := h.lines, h.ended, h.changed
		h.mu.Unlock()
		for ; seen < len(lines); seen++ {
			if match(lines[seen]) {
				return lines[seen], true
			}
		}
		if ended {
			return "", false
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("helper %s: no line awaited after %v", h.name, helperPatience)
		}
	}
}

// ids returns the IDs of the helper's lines of kind (admitted, stuck…)
// so far.
func (h *helper) ids(kind string) []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []int64
	for _, l := range h.lines {
		if v, ok := strings.CutPrefix(l, kind+" "); ok {
			for f := range strings.FieldsSeq(v) {
				if id, err := strconv.ParseInt(f, 10, 64); err == nil {
					out = append(out, id)
				}
			}
		}
	}
	return out
}

// admitted waits until the helper has reported n admissions in all.
func (h *helper) admitted(t *testing.T, n int) {
	t.Helper()
	count := 0
	if _, ok := h.await(t, func(l string) bool {
		if strings.HasPrefix(l, "admitted ") {
			count++
		}
		return count >= n
	}); !ok {
		t.Fatalf("helper %s ended after %d admissions, before %d", h.name, count, n)
	}
}

// order writes a line to the helper's stdin.
func (h *helper) order(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(h.stdin, line+"\n"); err != nil {
		t.Fatalf("helper %s: %v", h.name, err)
	}
}

// stop asks the helper to end, waits until it has, and returns how many
// calls it admitted.
func (h *helper) stop(t *testing.T) int {
	t.Helper()
	h.stdin.Close()
	return h.wait(t)
}

// wait waits until the helper has ended, and returns how many calls it
// admitted.
func (h *helper) wait(t *testing.T) int {
	t.Helper()
	line, ok := h.await(t, func(l string) bool { return strings.HasPrefix(l, "done ") })
	err := h.cmd.Wait()
	if !ok || err != nil {
		t.Fatalf("helper %s ended without saying done: %v", h.name, err)
	}
	n, _ := strconv.Atoi(strings.TrimPrefix(line, "done "))
	return n
}

// kill ends the helper with SIGKILL, and waits until it has.
func (h *helper) kill(t *testing.T) {
	t.Helper()
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	h.cmd.Wait()
}
