package testkit_test

import (
	"bytes"
	"os"
	"testing"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/state"
)

// Each StateFile is a state of its own, migrated: it opens without
// complaint, passes SQLite's integrity check, and what one test writes
// is not in another's.
func TestStateFileIsANewMigratedState(t *testing.T) {
	t.Parallel()
	a, b := testkit.StateFile(t, state.Open), testkit.StateFile(t, state.Open)
	if a == b {
		t.Fatalf("two StateFiles are both %s", a)
	}
	fa, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(fa) == 0 || !bytes.Equal(fa, fb) {
		t.Fatalf("StateFiles of %d and %d bytes; want two copies of one migrated state", len(fa), len(fb))
	}
	keys := map[string]string{}
	for _, path := range []string{a, b} {
		db, err := state.Open(t.Context(), path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if problems, err := db.IntegrityCheck(t.Context()); err != nil || len(problems) > 0 {
			t.Errorf("integrity check of %s: %q, %v; want none", path, problems, err)
		}
		key, err := db.SigningKey(t.Context(), "session")
		if err != nil {
			t.Fatal(err)
		}
		keys[path] = string(key)
	}
	if keys[a] == keys[b] {
		t.Errorf("both states hold the signing key the first one made; want a key each")
	}
}

// Parallel tests each get a state file of their own.
func TestStateFileInParallel(t *testing.T) {
	t.Parallel()
	for i := range 4 {
		t.Run("", func(t *testing.T) {
			t.Parallel()
			db, err := state.Open(t.Context(), testkit.StateFile(t, state.Open))
			if err != nil {
				t.Fatalf("test %d: %v", i, err)
			}
			db.Close()
		})
	}
}
