package state

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/mcp-quota/mcp-quota/state/postgres"
	"github.com/mcp-quota/mcp-quota/state/sqlite"
)

// TestMigrationsInOrder: both back ends' embedded migrations are read in
// the order of their numbers; a name without a number, a number used
// twice or none at all is refused.
func TestMigrationsInOrder(t *testing.T) {
	file := &fstest.MapFile{Data: []byte("SELECT 1;")}
	got, err := migrations(fstest.MapFS{"0010_later.sql": file, "0002_first.sql": file, "0003_next.sql": file})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range got {
		names = append(names, m.name)
	}
	if want := "0002_first.sql 0003_next.sql 0010_later.sql"; strings.Join(names, " ") != want {
		t.Errorf("order = %v; want %s", names, want)
	}
	if got[2].version != 10 {
		t.Errorf("version of %s = %d; want 10", got[2].name, got[2].version)
	}
	for _, bad := range []struct {
		fsys fstest.MapFS
		want string
	}{
		{fstest.MapFS{"0001_a.sql": file, "0001_b.sql": file}, "migration 0001_b.sql is out of order"},
		{fstest.MapFS{"0001_a.sql": file, "init.sql": file}, "migration init.sql: its name must start with its version"},
		{fstest.MapFS{}, "no migration"},
	} {
		if _, err := migrations(bad.fsys); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("migrations(%v) = %v; want an error saying %q", bad.fsys, err, bad.want)
		}
	}
	if _, err := migrations(sqlite.Migrations); err != nil {
		t.Errorf("SQLite's: %v", err)
	}
	if _, err := migrations(postgres.Migrations); err != nil {
		t.Errorf("PostgreSQL's: %v", err)
	}
}
