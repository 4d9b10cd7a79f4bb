package conformance

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
)

// A helper process is the test binary started again with helperEnv set
// to its job (a Job in JSON): TestMain calls RunHelper, which does
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

// A Job is what a helper process is asked to do: admit calls of key
// "shared" through a pacer on the store, as fast as it can.
type Job struct {
	Location        string        // the store, as state.OpenStore opens it
	JournalDir      string        // the journals' directory (PostgresOptions.JournalDir)
	Caller          string        // the caller name its calls have
	Quota           int64         // key "shared"'s documented policy: Quota calls…
	Window          time.Duration // …per Window
	InFlightTimeout time.Duration // how long an admitted attempt counts as in flight (pacer.WithInFlightTimeout)
	Run             time.Duration // stop after this long; 0 means once stdin closes
	Quiet           bool          // do not report each admission
	Victim          bool          // admit one call first and never finish it, hold slots, and take "finish" orders
	AdmitOnly       bool          // admit only: never record an outcome
	Callers         int           // callers calling at once, each one call after another; 0 means 1
}

// RunHelper does a helper process's job, and exits, when the test binary
// was started as one by the suite's multi-process tests; otherwise it
// returns at once. A test binary that runs the suite calls it first in
// its TestMain.
func RunHelper() {
	var job Job
	is, err := testkit.Job(helperEnv, &job)
	if !is {
		return
	}
	if err == nil {
		err = job.run(context.Background())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// SharedKey is the key the helpers admit calls of, with a documented
// policy of quota calls per window (none when quota is 0): no local
// safety limit gets in the way, so only that policy binds.
func SharedKey(quota int64, window time.Duration) *keystore.Key {
	k := &keystore.Key{Name: "shared", MaxRate: 1e9, MaxConcurrency: 1 << 20, LowWater: 0}
	if quota > 0 {
		k.Policies = []keystore.Policy{{Name: "default", Quota: quota, Window: window, Unit: ratelimit.Requests}}
	}
	return k
}

// victimSlots is how many slots of key "leased" a victim reserves.
const victimSlots = 6

// slotOutcome is the end of the call of key "leased"'s slot id.
func slotOutcome(id int64, at time.Time) ledger.Finished {
	return ledger.Finished{
		Attempt: ledger.Attempt{ID: id, Key: "leased", CallID: fmt.Sprint("slot-", id), Attempt: 1, Caller: "victim",
			Transport: "rest", Method: "GET", Target: "/items", State: ledger.Confirmed, Reason: reason.Reason{Kind: reason.Answered, Status: 200}, Status: 200,
			SentAt: at, AnsweredAt: at},
		Observations: []ledger.ObservationRecord{{Key: "leased", AttemptID: id, Status: 200, ReceivedAt: at, Method: "GET", Target: "/items",
			Observation: ratelimit.Observation{Policy: "default", Unit: ratelimit.Requests, Remaining: 7, HasRemaining: true, Shape: ratelimit.ShapeDraft}}},
	}
}

func (job Job) run(ctx context.Context) error {
	s, err := state.OpenStore(ctx, job.Location, state.PostgresOptions{JournalDir: job.JournalDir, Timeout: storeTimeout})
	if err != nil {
		return err
	}
	defer s.Close()
	h := &helping{job: job, store: s, out: bufio.NewWriter(os.Stdout),
		pacer: pacer.New(s, pacer.WithClock(clockOf(s)), pacer.WithInFlightTimeout(job.InFlightTimeout)),
		key:   SharedKey(job.Quota, job.Window)}
	if job.Victim {
		if err := h.victimize(ctx); err != nil {
			return err
		}
	}
	stop := h.takeOrders(ctx)
	var deadline <-chan time.Time
	if job.Run > 0 {
		deadline = time.After(job.Run)
	}
	h.say("ready")
	return h.admit(ctx, stop, deadline)
}

// helping is a helper process at its job.
type helping struct {
	job   Job
	store state.Store
	pacer *pacer.Pacer
	key   *keystore.Key
	mu    sync.Mutex // the lines of out
	out   *bufio.Writer
}

// say writes one line to stdout.
func (h *helping) say(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fmt.Fprintf(h.out, format+"\n", args...)
	h.out.Flush()
}

// call admits the job's nth call of key "shared".
func (h *helping) call(ctx context.Context, n int) (pacer.Ticket, error) {
	return h.pacer.Admit(ctx, pacer.Call{Key: h.key, Caller: h.job.Caller, Transport: "rest", Method: "GET",
		Target: "/items", CallID: fmt.Sprintf("%s-%d", h.job.Caller, n), Attempt: 1, MaxWait: time.Second})
}

// victimize admits a call it never finishes and reserves victimSlots
// slots of key "leased", and says so.
func (h *helping) victimize(ctx context.Context) error {
	t, err := h.call(ctx, 0)
	if err != nil {
		return err
	}
	h.say("stuck %d", t.ID)
	var first, last int64
	err = h.store.Update(ctx, func(tx ledger.Tx) error {
		at := tx.Clock(time.Now())
		first, last, err = tx.Reserve("leased", victimSlots, at, at.Add(h.job.InFlightTimeout))
		return err
	}, "leased")
	if err != nil {
		return err
	}
	h.say("reserved %d %d", first, last)
	return nil
}

// takeOrders does the orders that come as lines on stdin ("finish ID")
// beside the calls, and closes the channel it returns when stdin ends:
// the signal to stop.
func (h *helping) takeOrders(ctx context.Context) <-chan struct{} {
	stop := make(chan struct{})
	go func() {
		defer close(stop)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			id, err := strconv.ParseInt(strings.TrimPrefix(sc.Text(), "finish "), 10, 64)
			if err == nil {
				err = h.store.FinishLater(ctx, slotOutcome(id, time.Now()))
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "conformance helper: order %q: %v\n", sc.Text(), err)
				os.Exit(1)
			}
			h.say("finished %d", id)
		}
	}()
	return stop
}

// admit admits calls as fast as it can, and records their outcomes
// unless the job only admits, until stop closes or deadline comes.
func (h *helping) admit(ctx context.Context, stop <-chan struct{}, deadline <-chan time.Time) error {
	var (
		n     atomic.Int64 // admissions
		calls atomic.Int64 // calls started, for their IDs
		ended = make(chan struct{})
		wg    sync.WaitGroup
		errs  = make([]error, max(h.job.Callers, 1))
	)
	go func() {
		select {
		case <-stop:
		case <-deadline:
		}
		close(ended)
	}()
	for c := range errs {
		wg.Go(func() { errs[c] = h.calls(ctx, ended, &calls, &n) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return h.finish(ctx, int(n.Load()))
}

// calls is one caller of admit: it makes one call after another until
// ended closes, counting the admissions in n.
func (h *helping) calls(ctx context.Context, ended <-chan struct{}, calls, n *atomic.Int64) error {
	for {
		select {
		case <-ended:
			return nil
		default:
		}
		t, err := h.call(ctx, int(calls.Add(1)))
		if errors.Is(err, pacer.ErrPaused) {
			continue
		}
		if err != nil {
			return err
		}
		n.Add(1)
		if !h.job.Quiet {
			h.say("admitted %d", t.ID)
		}
		if h.job.AdmitOnly {
			continue
		}
		now := time.Now()
		if _, err := h.pacer.Done(ctx, t, pacer.Outcome{SentAt: now, AnsweredAt: now, Status: 200}); err != nil {
			return err
		}
	}
}

// finish gives back the pacer's unused slots and reports the n
// admissions.
func (h *helping) finish(ctx context.Context, n int) error {
	if err := h.pacer.Close(ctx); err != nil {
		return err
	}
	h.say("done %d", n)
	return nil
}

// A Helper is a running helper process doing a Job.
type Helper struct {
	*testkit.Process
	name string
}

// StartHelper starts a helper process doing job on the store of b at
// job.Location (whose journals it keeps where b says), and waits until it
// is ready. The test binary's TestMain must call RunHelper.
func StartHelper(t testing.TB, b Backend, job Job) *Helper {
	t.Helper()
	job.JournalDir = b.JournalDir(job.Location)
	h := &Helper{Process: testkit.Start(t, testkit.Spec{Name: job.Caller, Env: helperEnv, Job: job}), name: job.Caller}
	if _, ok := h.Await(t, func(l string) bool { return l == "ready" }); !ok {
		t.Fatalf("helper %s ended before it was ready (does the test binary's TestMain call conformance.RunHelper?)", h.name)
	}
	return h
}

// ids returns the IDs of the helper's lines of kind (admitted, stuck…)
// so far.
func (h *Helper) ids(kind string) []int64 {
	var out []int64
	for _, l := range h.Lines() {
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
func (h *Helper) admitted(t testing.TB, n int) {
	t.Helper()
	count := 0
	if _, ok := h.Await(t, func(l string) bool {
		if strings.HasPrefix(l, "admitted ") {
			count++
		}
		return count >= n
	}); !ok {
		t.Fatalf("helper %s ended after %d admissions, before %d", h.name, count, n)
	}
}

// Stop asks the helper to end, waits until it has, and returns how many
// calls it admitted.
func (h *Helper) Stop(t testing.TB) int {
	t.Helper()
	h.CloseInput()
	return h.Done(t)
}

// Done waits until the helper has ended, and returns how many calls it
// admitted.
func (h *Helper) Done(t testing.TB) int {
	t.Helper()
	line, ok := h.Await(t, func(l string) bool { return strings.HasPrefix(l, "done ") })
	err := h.Wait(t)
	if !ok || err != nil {
		t.Fatalf("helper %s ended without saying done: %v", h.name, err)
	}
	n, _ := strconv.Atoi(strings.TrimPrefix(line, "done "))
	return n
}
