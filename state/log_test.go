package state_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// scanLog answers what Window, Count and Nth answer, the slow way: by
// scanning the attempts table itself (the definition of the sliding-window
// log).
type scanLog struct {
	t  *testing.T
	db *sql.DB
}

func openScan(t *testing.T, path string) scanLog {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return scanLog{t: t, db: db}
}

func (s scanLog) window(key string, since time.Time) ledger.Window {
	s.t.Helper()
	var n int
	var oldest int64
	err := s.db.QueryRow(`SELECT count(*), coalesce(min(at), 0) FROM attempts WHERE key = ? AND at > ? AND counted = 1`,
		key, since.UnixMicro()).Scan(&n, &oldest)
	if err != nil {
		s.t.Fatal(err)
	}
	if n == 0 {
		return ledger.Window{}
	}
	return ledger.Window{Count: n, Oldest: time.UnixMicro(oldest)}
}

func (s scanLog) nth(key string, since time.Time, n int) time.Time {
	s.t.Helper()
	var us int64
	err := s.db.QueryRow(`SELECT at FROM attempts WHERE key = ? AND at > ? AND counted = 1 ORDER BY at LIMIT 1 OFFSET ?`,
		key, since.UnixMicro(), n-1).Scan(&us)
	if err == sql.ErrNoRows {
		return time.Time{}
	}
	if err != nil {
		s.t.Fatal(err)
	}
	return time.UnixMicro(us)
}

// check compares the log as db reads it with the scan, for every key and
// many windows.
func (s scanLog) check(db *state.DB, keys []string, from, to time.Time) {
	s.t.Helper()
	view(s.t, db, func(tx ledger.ReadTx) error {
		for _, key := range keys {
			for since := from.Add(-time.Second); !since.After(to); since = since.Add(2300 * time.Millisecond) {
				want := s.window(key, since)
				got, err := tx.Window(key, since)
				if err != nil {
					return err
				}
				if got.Count != want.Count || !got.Oldest.Equal(want.Oldest) {
					s.t.Errorf("Window(%s, %v): got %d from %v, want %d from %v", key, since.Sub(from), got.Count, got.Oldest, want.Count, want.Oldest)
				}
				if n, err := tx.Count(key, since); err != nil || n != want.Count {
					s.t.Errorf("Count(%s, %v): got %d, %v; want %d", key, since.Sub(from), n, err, want.Count)
				}
				for _, n := range []int{1, 2, want.Count / 2, want.Count, want.Count + 1} {
					if n < 1 {
						continue
					}
					got, err := tx.Nth(key, since, n)
					if want := s.nth(key, since, n); err != nil || !got.Equal(want) {
						s.t.Errorf("Nth(%s, %v, %d): got %v, %v; want %v", key, since.Sub(from), n, got, err, want)
					}
				}
			}
		}
		return nil
	})
}

// A file written before attempts were numbered has its log numbered when
// opened; an admission recorded by a process that does not number them is
// numbered too.
func TestLogOfAnOlderFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	init, err := os.ReadFile("sqlite/0001_init.sql")
	if err != nil {
		t.Fatal(err)
	}
	scan := openScan(t, path)
	insert := func(key string, at time.Time, counted bool) {
		t.Helper()
		_, err := scan.db.Exec(`INSERT INTO attempts (call_id, attempt, key, caller, transport, method, target, state, counted, at)
			VALUES ('c', 1, ?, 'x', 'rest', 'GET', '/', 'confirmed', ?, ?)`, key, counted, at.UnixMicro())
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := scan.db.Exec(string(init) + ";PRAGMA user_version = 1"); err != nil {
		t.Fatal(err)
	}
	for i, sec := range []int{5, 1, 3, 3, 9, 2} { // recorded in any order
		insert("a", t0.Add(time.Duration(sec)*time.Second), i != 2)
		insert("b", t0.Add(time.Duration(10-sec)*time.Second), true)
	}
	db := open(t, path)
	scan.check(db, []string{"a", "b"}, t0, t0.Add(10*time.Second))

	insert("a", t0.Add(11*time.Second), true) // by a process of the older version
	update(t, db, func(tx ledger.Tx) error {
		_, err := tx.InsertAttempt(ledger.Attempt{CallID: "d", Key: "a", State: ledger.Admitted, At: t0.Add(12 * time.Second)})
		return err
	})
	scan.check(db, []string{"a", "b"}, t0, t0.Add(13*time.Second))
	if problems, err := db.IntegrityCheck(context.Background()); err != nil || len(problems) > 0 {
		t.Errorf("IntegrityCheck: %v %q", err, problems)
	}
}

// A file written before the latency margin was kept keeps its keys'
// pacing state when opened, with no latency known yet, and its calls in
// flight are still found.
func TestKeyStateOfAnOlderFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	scan := openScan(t, path)
	for i, name := range []string{"sqlite/0001_init.sql", "sqlite/0002_attempt_seq.sql"} {
		body, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := scan.db.Exec(string(body) + fmt.Sprintf(";PRAGMA user_version = %d", i+1)); err != nil {
			t.Fatal(err)
		}
	}
	_, err := scan.db.Exec(`INSERT INTO key_state (key, last_admit_at, failures) VALUES ('k', ?, 2)`, t0.UnixMicro())
	if err != nil {
		t.Fatal(err)
	}
	_, err = scan.db.Exec(`INSERT INTO attempts (call_id, attempt, key, caller, transport, method, target, state, counted, at, lease_until)
		VALUES ('c', 1, 'k', 'x', 'rest', 'GET', '/', 'admitted', 1, ?, ?)`, t0.UnixMicro(), t0.Add(time.Minute).UnixMicro())
	if err != nil {
		t.Fatal(err)
	}
	db := open(t, path)
	view(t, db, func(tx ledger.ReadTx) error {
		ks, err := tx.KeyState("k")
		if want := (ledger.KeyState{Key: "k", LastAdmitAt: t0, Failures: 2}); err != nil || !ks.LastAdmitAt.Equal(t0) ||
			ks.Failures != 2 || ks.Latency != 0 || ks.PrevLatency != 0 || !ks.LatencySince.IsZero() {
			t.Errorf("KeyState: got %+v, %v, want %+v", ks, err, want)
		}
		f, err := tx.Flight("k", t0)
		if err != nil || f.Count != 1 || !f.Oldest.Equal(t0) {
			t.Errorf("Flight: got %+v, %v, want the one call admitted at t0", f, err)
		}
		return nil
	})
	if problems, err := db.IntegrityCheck(context.Background()); err != nil || len(problems) > 0 {
		t.Errorf("IntegrityCheck: %v %q", err, problems)
	}
}

// A file a newer mcp-quota wrote (its user_version beyond the newest
// migration) is refused, with ErrNewerSchema and nothing written to it.
func TestNewerFileRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db := open(t, path)
	update(t, db, func(tx ledger.Tx) error {
		_, err := tx.InsertAttempt(ledger.Attempt{CallID: "c", Key: "k", State: ledger.Admitted, At: t0})
		return err
	})
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	names, err := filepath.Glob("sqlite/*.sql")
	if err != nil || len(names) == 0 {
		t.Fatalf("the migrations: %v %v", names, err)
	}
	scan := openScan(t, path)
	newer := len(names) + 1
	if _, err := scan.db.Exec(fmt.Sprintf("PRAGMA user_version = %d", newer)); err != nil {
		t.Fatal(err)
	}
	schema := func() string {
		t.Helper()
		var version int
		var tables string
		if err := scan.db.QueryRow("SELECT (SELECT user_version FROM pragma_user_version), group_concat(sql, ';') FROM sqlite_master").
			Scan(&version, &tables); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(version, tables)
	}
	before := schema()
	if db, err := state.Open(context.Background(), path); !errors.Is(err, state.ErrNewerSchema) {
		if err == nil {
			db.Close()
		}
		t.Errorf("Open of a file of version %d: got %v, want ErrNewerSchema", newer, err)
	}
	if after := schema(); after != before {
		t.Errorf("the schema after the file was refused:\n%s\nbefore:\n%s", after, before)
	}
	if n := scan.window("k", time.Time{}).Count; n != 1 {
		t.Errorf("after the refusal: %d admissions, want the 1 there before", n)
	}
}
