package testkit

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// migrated is the content of a SQLite state file that the first
// StateFile call of this test binary created and migrated.
var migrated struct {
	once sync.Once
	b    []byte
	err  error
}

// StateFile returns the path of a new SQLite state file in a new
// tb.TempDir(): a copy of one that open created and migrated once for
// this test binary. Migrating a new file is most of what opening one
// costs (several times what opening a migrated copy costs, under -race);
// a copy is a new state like any other, its journals beside it, holding
// nothing but the schema, and a test opens it as it would have opened a
// new path.
//
// open is state.Open (testkit cannot import package state, whose own
// tests import testkit): testkit.StateFile(t, state.Open). The first
// call's open makes the file every call copies. StateFile is safe for
// parallel tests. Tests whose subject is migrating or creating a state
// open a new path for real instead.
func StateFile[DB io.Closer, O any](tb testing.TB, open func(context.Context, string, ...O) (DB, error)) string {
	tb.Helper()
	migrated.once.Do(func() { migrated.b, migrated.err = migrate(open) })
	if migrated.err != nil {
		tb.Fatalf("a migrated state to copy: %v", migrated.err)
	}
	path := filepath.Join(tb.TempDir(), "state.db")
	if err := os.WriteFile(path, migrated.b, 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

// OpenState opens a new StateFile with open (state.Open) and closes it
// when tb ends; it fails tb when the file does not open.
func OpenState[DB io.Closer, O any](tb testing.TB, open func(context.Context, string, ...O) (DB, error)) DB {
	tb.Helper()
	db, err := open(context.Background(), StateFile(tb, open))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// migrate opens a new state file in a directory of its own, closes it
// and returns its content; the directory is gone when it returns.
func migrate[DB io.Closer, O any](open func(context.Context, string, ...O) (DB, error)) ([]byte, error) {
	dir, err := os.MkdirTemp("", "testkit-state")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "state.db")
	db, err := open(context.Background(), path)
	if err != nil {
		return nil, err
	}
	if err := db.Close(); err != nil {
		return nil, err
	}
	// Closing the last connection checkpoints the write-ahead log into
	// the file and removes it; what is left in one would be lost.
	if fi, err := os.Stat(path + "-wal"); err == nil && fi.Size() > 0 {
		return nil, fmt.Errorf("the migrated state %s left %d bytes in its write-ahead log", path, fi.Size())
	}
	return os.ReadFile(path)
}
