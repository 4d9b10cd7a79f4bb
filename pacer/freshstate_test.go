package pacer_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/mcp-quota/mcp-quota/state"
)

// migrated is a state file that state.Open created and migrated once for
// this test binary. Migrating a new file is most of what opening one
// costs (several times what opening a migrated copy does, under -race),
// and newEnv opens one per test: it copies this one instead. A copy is a
// new state like any other (its journals live beside it), holding
// nothing but the schema.
var migrated struct {
	once sync.Once
	dir  string
	err  error
}

// freshState returns the path of a new state file in t.TempDir(): a copy
// of the migrated one.
func freshState(t *testing.T) string {
	t.Helper()
	migrated.once.Do(func() {
		migrated.dir, migrated.err = os.MkdirTemp("", "pacer-migrated")
		if migrated.err != nil {
			return
		}
		db, err := state.Open(context.Background(), filepath.Join(migrated.dir, "state.db"))
		if err == nil {
			err = db.Close()
		}
		migrated.err = err
	})
	if migrated.err != nil {
		t.Fatalf("a migrated state to copy: %v", migrated.err)
	}
	path := filepath.Join(t.TempDir(), "state.db")
	if err := copyFile(filepath.Join(migrated.dir, "state.db"), path); err != nil {
		t.Fatal(err)
	}
	return path
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// removeMigrated removes the migrated state, once the tests have run.
func removeMigrated() {
	if migrated.dir != "" {
		os.RemoveAll(migrated.dir)
	}
}
