package state_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/internal/conformance"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// TestKeepResponse: KeepResponse keeps an answer as PutResponse does and
// returns, from the same transaction, the key's kept targets newest
// first, at most keep of them: the oldest goes, and reads as gone; a
// target kept again becomes the newest; another key's answers are
// neither listed nor counted. On each back end.
func TestKeepResponse(t *testing.T) {
	t.Run("SQLite", func(t *testing.T) {
		db, err := state.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		keepResponse(t, db)
	})
	t.Run("PostgreSQL", func(t *testing.T) {
		keepResponse(t, openPostgres(t, startPostgres(t).CreateDatabase(t), state.PostgresOptions{}))
	})
}

func keepResponse(t *testing.T, s ledger.Store) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	keep := func(key, target string, i int) []string {
		t.Helper()
		var got []string
		err := s.Update(context.Background(), func(tx ledger.Tx) error {
			var err error
			got, err = tx.(*state.Tx).KeepResponse(ledger.StoredResponse{Key: key, Target: target, Status: 200,
				Body: []byte(target), Digest: "d", StoredAt: t0.Add(time.Duration(i) * time.Second)}, 3)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	keep("other", "/x", 0)
	var got []string
	for i := range 4 {
		got = keep("k", fmt.Sprintf("/%d", i), i+1)
	}
	if diff := cmp.Diff(got, []string{"/3", "/2", "/1"}); diff != "" {
		t.Errorf("after 4 answers, keeping 3 (-got +want):\n%s", diff)
	}
	got = keep("k", "/1", 5)
	if diff := cmp.Diff(got, []string{"/1", "/3", "/2"}); diff != "" {
		t.Errorf("after /1 again (-got +want):\n%s", diff)
	}
	// An answer older than the one kept (a journal replayed after a
	// crash, another process's slower copy) does not replace it.
	err := s.Update(context.Background(), func(tx ledger.Tx) error {
		var err error
		got, err = tx.(*state.Tx).KeepResponse(ledger.StoredResponse{Key: "k", Target: "/1", Status: 200,
			Body: []byte("older"), Digest: "d", StoredAt: t0.Add(2 * time.Second)}, 3)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got, []string{"/1", "/3", "/2"}); diff != "" {
		t.Errorf("after an older answer of /1 (-got +want):\n%s", diff)
	}
	err = s.View(context.Background(), func(tx ledger.ReadTx) error {
		if _, ok, err := tx.Response("k", "/0"); ok || err != nil {
			t.Errorf("the oldest answer: kept (%v), want it gone", err)
		}
		if r, ok, err := tx.Response("k", "/1"); !ok || err != nil || string(r.Body) != "/1" {
			t.Errorf("an answer kept again: %+v, %v, %v", r, ok, err)
		}
		targets, err := tx.(*state.Tx).StoredTargets("other")
		if diff := cmp.Diff(targets, []string{"/x"}); diff != "" || err != nil {
			t.Errorf("another key's targets (-got +want):\n%s%v", diff, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestKeepLater: an answer given to KeepLater is kept through the
// process's journal, with at most keep answers of its key: a View of the
// process reads it kept, and listed hears the key's kept targets as the
// transaction that kept it read them. A body larger than the journal
// takes is kept all the same. On each back end.
func TestKeepLater(t *testing.T) {
	t.Run("SQLite", func(t *testing.T) {
		keepLater(t, open(t, filepath.Join(t.TempDir(), "state.db")))
	})
	t.Run("PostgreSQL", func(t *testing.T) {
		keepLater(t, openPostgres(t, startPostgres(t).CreateDatabase(t), state.PostgresOptions{JournalDir: t.TempDir()}))
	})
}

type laterKeeper interface {
	ledger.Store
	KeepLater(ctx context.Context, r ledger.StoredResponse, keep int, listed func(targets []string)) error
}

func keepLater(t *testing.T, s laterKeeper) {
	var mu sync.Mutex
	var lists [][]string
	for i, target := range []string{"/a", "/b", "/c"} {
		r := ledger.StoredResponse{Key: "k", Target: target, ETag: `"` + target + `"`, Status: 200, ContentType: "text/plain",
			Body: []byte("body of " + target), Digest: "d" + target, StoredAt: t0.Add(time.Duration(i) * time.Second)}
		if target == "/c" {
			r.Body = []byte(strings.Repeat("c", 300<<10)) // past what the journal takes
		}
		if err := s.KeepLater(context.Background(), r, 2, func(targets []string) {
			mu.Lock()
			lists = append(lists, targets)
			mu.Unlock()
		}); err != nil {
			t.Fatal(err)
		}
		var got ledger.StoredResponse
		var ok bool
		if err := s.View(context.Background(), func(tx ledger.ReadTx) error {
			var err error
			got, ok, err = tx.Response("k", target)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if !ok || got.ETag != r.ETag || string(got.Body) != string(r.Body) || !got.StoredAt.Equal(r.StoredAt) {
			t.Errorf("%s read after KeepLater: found %v, ETag %s, %d bytes of body; want it kept", target, ok, got.ETag, len(got.Body))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := [][]string{{"/a"}, {"/b", "/a"}, {"/c", "/b"}}
	if diff := cmp.Diff(lists, want); diff != "" {
		t.Errorf("what listed heard (-got +want):\n%s", diff)
	}
}

// TestKeepLaterTogether: answers the journal's applier keeps in one
// transaction leave what keeping them one after another would: at most
// the limit of each key, the newest. Every answer of a key with the same
// limit as the next of its key hears the key's targets as they are after
// the last of them; one whose next has another limit is trimmed to its
// own first.
func TestKeepLaterTogether(t *testing.T) {
	// The applier lingers on a clock that does not move, until a View
	// hurries it: what is kept before each View is one batch.
	t.Run("SQLite", func(t *testing.T) {
		keepLaterTogether(t, open(t, filepath.Join(t.TempDir(), "state.db"), state.WithClock(testkit.NewClock(t0))))
	})
	t.Run("PostgreSQL", func(t *testing.T) {
		keepLaterTogether(t, openPostgres(t, startPostgres(t).CreateDatabase(t),
			state.PostgresOptions{JournalDir: t.TempDir(), Clock: testkit.NewClock(t0)}))
	})
}

func keepLaterTogether(t *testing.T, db laterKeeper) {
	heard := map[string][]string{}
	var mu sync.Mutex
	keep := func(key, target string, i, limit int) {
		t.Helper()
		r := ledger.StoredResponse{Key: key, Target: target, Status: 200, Body: []byte(target), Digest: "d",
			StoredAt: t0.Add(time.Duration(i) * time.Second)}
		if err := db.KeepLater(context.Background(), r, limit, func(targets []string) {
			mu.Lock()
			heard[key+target] = targets
			mu.Unlock()
		}); err != nil {
			t.Fatal(err)
		}
	}
	read := func(key string) []string {
		t.Helper()
		var targets []string
		if err := db.View(context.Background(), func(tx ledger.ReadTx) error {
			var err error
			targets, err = tx.(*state.Tx).StoredTargets(key)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return targets
	}
	keep("k", "/0", 0, 3)
	keep("other", "/x", 1, 3)
	for i := 1; i <= 4; i++ {
		keep("k", fmt.Sprintf("/%d", i), i+1, 3)
	}
	if diff := cmp.Diff(read("k"), []string{"/4", "/3", "/2"}); diff != "" {
		t.Errorf("k's targets after one batch (-got +want):\n%s", diff)
	}
	want := map[string][]string{"other/x": {"/x"}}
	for i := range 5 {
		want[fmt.Sprintf("k/%d", i)] = []string{"/4", "/3", "/2"}
	}
	keep("k", "/5", 6, 3)
	keep("k", "/6", 7, 2)
	if diff := cmp.Diff(read("k"), []string{"/6", "/5"}); diff != "" {
		t.Errorf("k's targets after a batch whose last answer has a lower limit (-got +want):\n%s", diff)
	}
	want["k/5"], want["k/6"] = []string{"/5", "/4", "/3"}, []string{"/6", "/5"}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff(heard, want); diff != "" {
		t.Errorf("what each answer's listed heard (-got +want):\n%s", diff)
	}
}

// TestRecoverKeepsAnAnswer: an answer a process handed to its journal
// before it ended is kept by the next process to open the state file,
// beside the outcomes that journal holds.
func TestRecoverKeepsAnAnswer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db := open(t, path)
	ids := reserve(t, db, 1)
	// A journal as KeepLater and FinishLater write it.
	kept, _ := json.Marshal(map[string]any{"kept": map[string]any{"keep": 32, "response": ledger.StoredResponse{Key: "k",
		Target: "/kept", ETag: `"v1"`, Status: 200, Body: []byte("the kept body"), Digest: "d", StoredAt: t0}}})
	fin, _ := json.Marshal(conformance.FinishedSlot(ids[0], 1))
	if err := os.MkdirAll(path+".outcomes", 0o700); err != nil {
		t.Fatal(err)
	}
	journal := string(fin) + "\n" + string(kept) + "\n" + `{"kept":{"response":{"Key":"k","Tar` // the last line cut short
	if err := os.WriteFile(filepath.Join(path+".outcomes", "4242-dead.log"), []byte(journal), 0o600); err != nil {
		t.Fatal(err)
	}
	other := open(t, path)
	var got ledger.StoredResponse
	var ok bool
	if err := other.View(context.Background(), func(tx ledger.ReadTx) error {
		var err error
		got, ok, err = tx.Response("k", "/kept")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !ok || string(got.Body) != "the kept body" || got.ETag != `"v1"` {
		t.Errorf("the answer a dead process's journal held: found %v, body %q, ETag %s; want it kept", ok, got.Body, got.ETag)
	}
	if states := statesOf(t, other); states[ledger.Confirmed] != 1 {
		t.Errorf("the outcome beside it: %v, want 1 confirmed", states)
	}
	if files := journalFiles(t, path); len(files) != 0 {
		t.Errorf("journal files after recovery: %v, want none", files)
	}
}
