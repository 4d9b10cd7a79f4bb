package state_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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
	err := s.View(context.Background(), func(tx ledger.Tx) error {
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
