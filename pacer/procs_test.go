package pacer_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// sends returns every admitted attempt of the shared key in the file at
// path, oldest first.
func sends(t *testing.T, db *state.DB) []ledger.Send {
	t.Helper()
	var out []ledger.Send
	err := db.View(context.Background(), func(tx ledger.Tx) error {
		var err error
		out, err = tx.Sends("shared", time.Time{}, 1<<30)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func openState(t *testing.T, path string) *state.DB {
	t.Helper()
	db, err := state.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// hammer runs three helper processes on one key of a new state file with
// a documented quota per window, for run, and returns the key's log with
// how many calls the processes report.
func hammer(t *testing.T, quota int64, window, run time.Duration) ([]ledger.Send, int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	db := openState(t, path)
	var hs []*helper
	for i := range 3 {
		h, _ := startHelper(t, helperConfig{Path: path, Caller: fmt.Sprintf("p%d", i), Quota: quota, Window: window,
			Run: run, Lease: time.Minute, Quiet: true})
		hs = append(hs, h)
	}
	made := 0
	for _, h := range hs {
		made += h.wait(t)
	}
	return sends(t, db), made
}

// Three processes hammering one key on one state file share its budget
// exactly: no rolling window ever holds more than the quota, and the
// quota is used.
func TestProcessesShareOneBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const (
		quota  = 25
		window = 300 * time.Millisecond
		run    = 1500 * time.Millisecond
	)
	list, made := hammer(t, quota, window, run)
	if len(list) != made {
		t.Errorf("the state file holds %d admissions, the processes report %d", len(list), made)
	}
	times := make([]time.Time, len(list))
	for i, s := range list {
		times[i] = s.At
	}
	if got := mostIn(times, window); got > quota {
		t.Errorf("got %d admissions in one rolling window of %v, want at most %d", got, window, quota)
	}
	if got := mostIn(times, window); got < quota {
		t.Errorf("got at most %d admissions in any window of %v, want the quota of %d used", got, window, quota)
	}
	t.Logf("%d admissions by 3 processes in %v", len(list), run)
}

// One of two processes is killed with SIGKILL in the middle of a load:
// the other keeps serving, the file stays sound, every attempt recorded
// before the kill is still there, and the killed process's calls in
// flight are marked interrupted once their lease runs out.
func TestProcessKilledMidLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const lease = 10 * time.Second
	path := filepath.Join(t.TempDir(), "state.db")
	db := openState(t, path)
	cfg := helperConfig{Path: path, Quota: 1 << 30, Window: time.Second, Lease: lease, Stuck: true}
	cfg.Caller = "victim"
	victim, stuck := startHelper(t, cfg)
	cfg.Caller = "survivor"
	survivor, _ := startHelper(t, cfg)

	var printed []int64 // committed by the victim, as it said
	for len(printed) < 100 {
		id, ok := victim.admitted()
		if !ok {
			t.Fatal("the victim ended early")
		}
		printed = append(printed, id)
	}
	before := sends(t, db)
	if err := victim.cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	victim.cmd.Wait()
	killedAt := time.Now()
	for range 50 { // the survivor keeps serving
		if _, ok := survivor.admitted(); !ok {
			t.Fatal("the survivor stopped after the kill")
		}
	}
	survivor.stop(t)

	if problems, err := db.IntegrityCheck(context.Background()); err != nil || len(problems) > 0 {
		t.Fatalf("integrity check: %v %q", err, problems)
	}
	after := map[int64]ledger.Send{}
	for _, s := range sends(t, db) {
		after[s.ID] = s
	}
	for _, s := range before {
		if _, ok := after[s.ID]; !ok {
			t.Errorf("attempt %d, recorded before the kill, is gone", s.ID)
		}
	}
	for _, id := range append(printed, stuck) {
		if _, ok := after[id]; !ok {
			t.Errorf("attempt %d, committed by the victim, is gone", id)
		}
	}
	if s := after[stuck]; s.State != ledger.Admitted {
		t.Errorf("the victim's call in flight: got %q before its lease ran out, want admitted", s.State)
	}

	// Once the leases have run out, a sweep marks the victim's calls in
	// flight as interrupted.
	_, err := db.Sweep(context.Background(), killedAt.Add(lease), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var inFlight []int64
	for _, s := range sends(t, db) {
		switch {
		case s.State == ledger.Admitted:
			inFlight = append(inFlight, s.ID)
		case s.ID == stuck && s.State != ledger.Interrupted:
			t.Errorf("the victim's call in flight: got %q after the sweep, want interrupted", s.State)
		}
	}
	if len(inFlight) > 0 {
		t.Errorf("attempts %v are still in flight after the sweep", inFlight)
	}
	if !slices.ContainsFunc(sends(t, db), func(s ledger.Send) bool { return s.ID == stuck && s.State == ledger.Interrupted }) {
		t.Error("the victim's stuck call was not marked interrupted")
	}
}

// Three processes hammering a key with a quota large enough to lease
// share it exactly too: every process counts the slots the others hold,
// so no rolling window of the log ever holds more than the quota.
func TestProcessesShareOneLeasedBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const (
		quota  = 3000
		window = 10 * time.Second // leases of 250 ms: a pace of 64 calls a second leases, even under -race
		run    = 1500 * time.Millisecond
	)
	list, made := hammer(t, quota, window, run)
	var times []time.Time
	calls, unused := 0, 0
	for _, s := range list {
		times = append(times, s.At)
		switch s.State {
		case ledger.Reserved:
			t.Errorf("slot %d is still reserved after every process closed", s.ID)
		case ledger.Released:
			unused++
		default:
			calls++
		}
	}
	if calls != made {
		t.Errorf("the state file holds %d calls, the processes report %d", calls, made)
	}
	if got := mostIn(times, window); got > quota {
		t.Errorf("got %d admissions in one rolling window of %v, want at most %d", got, window, quota)
	}
	// Slots of a lease share its grant's time. While the quota binds,
	// calls are admitted one at a time; before that, from leases.
	at := map[time.Time]bool{}
	for _, t := range times {
		at[t] = true
	}
	if len(at) > len(times)/2 {
		t.Errorf("%d admissions at %d different times: want many from leases", len(times), len(at))
	}
	t.Logf("%d calls by 3 processes in %v, %d slots released unused", calls, run, unused)
}
