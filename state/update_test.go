package state_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// Updates made at the same time run one after another, each seeing what
// the ones before it committed or are about to commit with it; one that
// fails leaves nothing behind, and the others are unaffected.
func TestConcurrentUpdates(t *testing.T) {
	db := newDB(t)
	const n = 40
	boom := errors.New("boom")
	first, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var seen []int // the count each successful update read
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = db.Update(context.Background(), func(tx ledger.Tx) error {
				if i == 0 { // hold the file while the others queue up
					close(first)
					<-release
				}
				c, err := tx.Count("k", time.Time{})
				if err != nil {
					return err
				}
				if _, err := tx.InsertAttempt(ledger.Attempt{CallID: "c", Key: "k", State: ledger.Admitted,
					At: t0.Add(time.Duration(c) * time.Second)}); err != nil {
					return err
				}
				if i%5 == 4 {
					return boom
				}
				mu.Lock()
				seen = append(seen, c)
				mu.Unlock()
				return nil
			})
		}()
		if i == 0 {
			<-first
		}
	}
	time.Sleep(50 * time.Millisecond)
	close(release)
	wg.Wait()
	for i, err := range errs {
		if want := error(nil); i%5 == 4 {
			want = boom
			if !errors.Is(err, want) {
				t.Errorf("update %d: got %v, want %v", i, err, want)
			}
		} else if err != nil {
			t.Errorf("update %d: got %v, want it committed", i, err)
		}
	}
	slices.Sort(seen)
	for i, c := range seen {
		if c != i {
			t.Fatalf("the counts successful updates read: got %v, want 0, 1, 2, … each once", seen)
		}
	}
	view(t, db, func(tx ledger.Tx) error {
		w, err := tx.Window("k", time.Time{})
		if want := (ledger.Window{Count: len(seen), Oldest: t0}); !cmp.Equal(w, want) {
			t.Errorf("Window after the updates: got %+v, want %+v", w, want)
		}
		last, _ := tx.Nth("k", time.Time{}, len(seen))
		if want := t0.Add(time.Duration(len(seen)-1) * time.Second); !last.Equal(want) {
			t.Errorf("the last admission: got %v, want %v", last, want)
		}
		return err
	})
}

// An update whose context ends while it waits for another update of the
// same process returns the context's error, and its function never runs.
func TestUpdateCancelledWhileQueued(t *testing.T) {
	db := newDB(t)
	holding, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		done <- db.Update(context.Background(), func(tx ledger.Tx) error {
			close(holding)
			<-release
			return nil
		})
	}()
	<-holding
	ctx, cancel := context.WithCancel(context.Background())
	ran := false
	queued := make(chan error)
	go func() {
		queued <- db.Update(ctx, func(tx ledger.Tx) error { ran = true; return nil })
	}()
	time.Sleep(10 * time.Millisecond)
	cancel()
	if err := <-queued; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled while queued: got %v, want context.Canceled", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ran {
		t.Error("the cancelled update's function ran")
	}
	update(t, db, func(tx ledger.Tx) error { return nil }) // the file is still usable
}

// A function that panics rolls back what it wrote, and the panic reaches
// its own caller, alone or in a transaction shared with others, which
// commit.
func TestUpdatePanics(t *testing.T) {
	db := newDB(t)
	insert := func(tx ledger.Tx, sec int) error {
		_, err := tx.InsertAttempt(ledger.Attempt{CallID: "c", Key: "k", State: ledger.Admitted, At: t0.Add(time.Duration(sec) * time.Second)})
		return err
	}
	panics := func(sec int) (v any) {
		defer func() { v = recover() }()
		db.Update(context.Background(), func(tx ledger.Tx) error {
			if err := insert(tx, sec); err != nil {
				return err
			}
			panic("boom")
		})
		return nil
	}
	if v := panics(0); v != "boom" {
		t.Errorf("a panic alone: got %v, want it raised again", v)
	}

	holding, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(4)
	commits := func(sec int, before func()) {
		defer wg.Done()
		err := db.Update(context.Background(), func(tx ledger.Tx) error {
			before()
			return insert(tx, sec)
		})
		if err != nil {
			t.Errorf("update at %d s: %v", sec, err)
		}
	}
	go commits(1, func() { close(holding); <-release }) // holds the file while the others queue up
	<-holding
	var v any
	go commits(2, func() {})
	go func() { defer wg.Done(); v = panics(3) }()
	go commits(4, func() {})
	time.Sleep(20 * time.Millisecond)
	close(release)
	wg.Wait()
	if v != "boom" {
		t.Errorf("a panic in a shared transaction: got %v, want it raised again in its caller", v)
	}
	view(t, db, func(tx ledger.Tx) error {
		sends, err := tx.Sends("k", time.Time{}, 10)
		var got []time.Duration
		for _, s := range sends {
			got = append(got, s.At.Sub(t0))
		}
		if want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}; !slices.Equal(got, want) {
			t.Errorf("after the panics: got sends at %v, want %v", got, want)
		}
		return err
	})
}
