package state_test

import (
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
)

// What PostgreSQL alone does: keys that do not wait for each other, one
// clock for every host, its errors, its migrations (in
// postgres_schema_test.go) and its secrets. The behaviours both back ends
// share are in the conformance suite (conformance_test.go); the server
// going away is in postgres_outage_test.go.

// startPostgres starts a throwaway server for t and gives this process
// its password, as PGPASSWORD.
func startPostgres(t *testing.T) *pgtest.Server {
	t.Helper()
	srv := pgtest.Start(t)
	t.Setenv("PGPASSWORD", srv.Password())
	return srv
}

// openPostgres opens the database at url with o, and closes it when t
// ends.
func openPostgres(t testing.TB, url string, o state.PostgresOptions) *state.Postgres {
	t.Helper()
	pg, err := state.OpenPostgres(context.Background(), url, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	return pg
}

// rawConn connects to the database at url as the harness's role, past
// the state's own code, and closes the connection when t ends.
func rawConn(t testing.TB, srv *pgtest.Server, url string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Password = srv.Password()
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func TestPostgres(t *testing.T) {
	srv := startPostgres(t)
	t.Run("keys do not wait for each other", func(t *testing.T) { keysDoNotWaitForEachOther(t, srv) })
	t.Run("a history filled at once is the history recorded one by one", func(t *testing.T) { fillsAsRecordedOnPostgres(t, srv) })
	t.Run("an admission of a key not held fails", func(t *testing.T) { admissionNeedsItsKey(t, srv) })
	t.Run("hosts whose clocks differ count one window", func(t *testing.T) { oneClock(t, srv) })
	t.Run("pacers on hosts whose clocks differ share one budget", func(t *testing.T) { pacersShareOneClock(t, srv) })
	t.Run("bad input is refused in words that name no password", func(t *testing.T) { badInput(t, srv) })
	t.Run("a newer schema is refused with nothing written", func(t *testing.T) { newerSchema(t, srv) })
	t.Run("an older or empty schema is migrated", func(t *testing.T) { olderSchema(t, srv) })
	t.Run("hosts starting at once migrate once", func(t *testing.T) { migrationsAtOnce(t, srv) })
	t.Run("an outcome the database refuses is set aside", func(t *testing.T) { refusedOutcome(t, srv) })
	t.Run("the password is in no table", func(t *testing.T) { passwordInNoTable(t, srv) })
	t.Run("a keyword/value connection string names the database", func(t *testing.T) { keywordValue(t, srv) })
	t.Run("a state that fails to open leaves no journal directory", func(t *testing.T) { noJournalDirLeft(t, srv) })
	t.Run("both back ends' schemas hold the same things", func(t *testing.T) { schemasHoldTheSame(t, srv) })
	t.Run("flags written by the previous schema are migrated in place", func(t *testing.T) { flagsMigrated(t, srv) })
	t.Run("reasons written before they were data read back as their words", func(t *testing.T) { reasonsMigrated(t, srv) })
}

// A keyword/value connection string (libpq's other form) opens the same
// database as its URL: what one records, the other reads.
func keywordValue(t *testing.T, srv *pgtest.Server) {
	u, err := neturl.Parse(srv.CreateDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	kv := fmt.Sprintf("host=%s port=%s user=%s dbname='%s' sslmode=disable", u.Hostname(), u.Port(), u.User.Username(), strings.TrimPrefix(u.Path, "/"))
	where, err := state.PostgresWhere(kv)
	if err != nil {
		t.Fatalf("PostgresWhere(%q): %v", kv, err)
	}
	if other, _ := state.PostgresWhere(u.String()); where != other {
		t.Errorf("the keyword/value string names %s, the URL %s: want one name for one database", where, other)
	}
	byURL := openPostgres(t, u.String(), state.PostgresOptions{})
	store, err := state.OpenStore(context.Background(), kv, state.PostgresOptions{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("OpenStore(%q): %v", kv, err)
	}
	defer store.Close()
	byKV, ok := store.(*state.Postgres)
	if !ok {
		t.Fatalf("OpenStore(%q) opened a %T, want a *state.Postgres", kv, store)
	}
	update(t, byKV, func(tx ledger.Tx) error {
		_, err := tx.InsertAttempt(ledger.Attempt{CallID: "kv", Attempt: 1, Key: "k", State: ledger.Admitted, At: t0})
		return err
	}, "k")
	var got []ledger.Attempt
	if err := byURL.View(context.Background(), func(tx ledger.ReadTx) error {
		var err error
		got, err = tx.Activity(ledger.ActivityFilter{Key: "k", Limit: 10})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].CallID != "kv" {
		t.Errorf("read through the URL: %+v; want the attempt recorded through the keyword/value string", got)
	}
}

// OpenPostgres makes no journal directory: a database that refuses the
// login, or is not there, leaves nothing under the journals.
func noJournalDirLeft(t *testing.T, srv *pgtest.Server) {
	dir := filepath.Join(t.TempDir(), "journals", "db")
	if _, err := state.OpenPostgres(context.Background(), srv.URL("no_such_database"), state.PostgresOptions{JournalDir: dir, Timeout: 5 * time.Second}); err == nil {
		t.Fatal("OpenPostgres of a missing database succeeded")
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after a failed open the journal directory %s is there (%v); want none", dir, err)
	}
}

// While a transaction holds key A (its function blocked), an Update of
// key B runs, in the same process and in another; an Update of A waits
// for it, and one that waits past its Timeout fails with ErrUnavailable.
func keysDoNotWaitForEachOther(t *testing.T, srv *pgtest.Server) {
	url := srv.CreateDatabase(t)
	// The other store's Timeout leaves its Updates of B time on a loaded
	// machine; the holder's outlasts it, since it holds A meanwhile.
	const timeout = outageTimeout
	holder := openPostgres(t, url, state.PostgresOptions{Timeout: hangs})
	other := openPostgres(t, url, state.PostgresOptions{Timeout: timeout})
	admit := func(key string, at time.Time) func(ledger.Tx) error {
		return func(tx ledger.Tx) error {
			_, err := tx.InsertAttempt(ledger.Attempt{CallID: "c", Attempt: 1, Key: key, State: ledger.Admitted, At: at})
			return err
		}
	}
	holding, release := make(chan struct{}), make(chan struct{})
	held := make(chan error)
	go func() {
		held <- holder.Update(context.Background(), func(tx ledger.Tx) error {
			if err := admit("A", t0)(tx); err != nil {
				return err
			}
			close(holding)
			<-release
			return nil
		}, "A")
	}()
	<-holding
	for name, s := range map[string]*state.Postgres{"the same process": holder, "another process": other} {
		if err := s.Update(context.Background(), admit("B", t0), "B"); err != nil {
			t.Errorf("an Update of key B from %s while A is held: %v", name, err)
		}
	}

	start := time.Now()
	ran := false
	err := other.Update(context.Background(), func(tx ledger.Tx) error { ran = true; return nil }, "A")
	took := time.Since(start)
	if !errors.Is(err, state.ErrUnavailable) || !state.Storage(err) {
		t.Errorf("an Update of key A, held past its Timeout: got %v, want ErrUnavailable", err)
	}
	if took < timeout || took > hangs { // bounded, not hung
		t.Errorf("an Update of key A with a Timeout of %v failed after %v", timeout, took)
	}
	if ran {
		t.Error("the Update that waited past its Timeout ran its function")
	}

	waited := make(chan error)
	go func() {
		waited <- holder.Update(context.Background(), func(tx ledger.Tx) error {
			n, err := tx.Count("A", time.Time{})
			if err == nil && n != 1 {
				err = fmt.Errorf("it read %d admissions of A, want the holder's 1", n)
			}
			return err
		}, "A")
	}()
	close(release)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Errorf("an Update of key A, waiting for the holder: %v", err)
	}
}

// On PostgreSQL a transaction records an admission only of a key it
// holds: what it decided on could otherwise change under it.
func admissionNeedsItsKey(t *testing.T, srv *pgtest.Server) {
	pg := openPostgres(t, srv.CreateDatabase(t), state.PostgresOptions{})
	for name, fn := range map[string]func(ledger.Tx) error{
		"InsertAttempt of an admission": func(tx ledger.Tx) error {
			_, err := tx.InsertAttempt(ledger.Attempt{CallID: "c", Key: "k", State: ledger.Admitted, At: t0})
			return err
		},
		"Reserve": func(tx ledger.Tx) error {
			_, _, err := tx.Reserve("k", 2, t0, t0.Add(time.Minute))
			return err
		},
	} {
		if err := pg.Update(context.Background(), fn, "other"); err == nil {
			t.Errorf("%s of a key not held: got no error", name)
		}
	}
	err := pg.Update(context.Background(), func(tx ledger.Tx) error {
		_, err := tx.InsertAttempt(ledger.Attempt{CallID: "c", Key: "k", State: ledger.RejectedLocal, At: t0})
		return err
	})
	if err != nil {
		t.Errorf("a refusal recorded without holding its key: %v", err)
	}
	view(t, pg, func(tx ledger.ReadTx) error {
		n, err := tx.Count("k", time.Time{})
		if n != 0 {
			t.Errorf("after admissions of a key not held: %d counted, want none", n)
		}
		return err
	})
}

// skewed returns a clock d ahead of this one.
func skewed(d time.Duration) clock.Clock {
	return clock.Source(func() time.Time { return time.Now().Add(d) })
}

// Two hosts whose clocks differ by seconds (PostgresOptions.Clock) record
// admissions at the server's clock (Tx.Clock), one after another, and a
// window counted by either holds what the other admitted.
func oneClock(t *testing.T, srv *pgtest.Server) {
	url := srv.CreateDatabase(t)
	locals := []clock.Clock{skewed(7 * time.Second), skewed(-7 * time.Second)}
	hosts := []*state.Postgres{
		openPostgres(t, url, state.PostgresOptions{Clock: locals[0], Instance: "ahead"}),
		openPostgres(t, url, state.PostgresOptions{Clock: locals[1], Instance: "behind"}),
	}
	for _, h := range hosts {
		if d := time.Until(h.Now()); d.Abs() > time.Second {
			t.Errorf("Now of a host whose clock is off by 7 s: %v from the server's, want the server's", d)
		}
	}
	var recorded []time.Time
	for i := range 20 {
		h, local := hosts[i%2], locals[i%2]
		update(t, h, func(tx ledger.Tx) error {
			at := tx.Clock(local.Now()) // the host's own clock, which the server's overrides
			if again := tx.Clock(time.Time{}); !again.Equal(at) {
				t.Errorf("Clock twice in one transaction: %v, then %v", at, again)
			}
			recorded = append(recorded, at)
			_, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint(i), Key: "k", Caller: h.Instance(), State: ledger.Admitted, At: at})
			return err
		}, "k")
	}
	if !slices.IsSortedFunc(recorded, time.Time.Compare) {
		t.Errorf("admissions by two hosts, one after another, at %v: want the order they were made in", recorded)
	}
	if d := time.Since(recorded[len(recorded)-1]); d.Abs() > time.Second {
		t.Errorf("the last admission is %v from the server's clock, want at it", d)
	}
	since := recorded[9] // the window after the tenth admission
	for _, h := range hosts {
		view(t, h, func(tx ledger.ReadTx) error {
			w, err := tx.WindowByCaller("k", since)
			if w.Count != 10 || w.ByCaller["ahead"] != 5 || w.ByCaller["behind"] != 5 {
				t.Errorf("the window read by %s: %+v, want 10 admissions, 5 of each host", h.Instance(), w)
			}
			return err
		})
	}
}

// Two pacers on hosts whose clocks differ by seconds, each timing its
// waits by the server's clock (Postgres.Now), admitting calls of one key
// by turns, never admit more than its quota in a window, and use it.
func pacersShareOneClock(t *testing.T, srv *pgtest.Server) {
	url := srv.CreateDatabase(t)
	const (
		quota  = 5
		window = 400 * time.Millisecond
		calls  = 3 * quota
	)
	key := &keystore.Key{Name: "shared", MaxRate: 1e9, MaxConcurrency: 1 << 20,
		Policies: []keystore.Policy{{Name: "default", Quota: quota, Window: window, Unit: ratelimit.Requests}}}
	var pacers []*pacer.Pacer
	var clocks []clock.Clock // each pacer's: its server's, as its host reckons it
	for _, d := range []time.Duration{5 * time.Second, -5 * time.Second} {
		pg := openPostgres(t, url, state.PostgresOptions{Clock: skewed(d)})
		clocks = append(clocks, clock.Source(pg.Now))
		pacers = append(pacers, pacer.New(pg, pacer.WithClock(clocks[len(clocks)-1])))
	}
	for i := range calls {
		p := pacers[i%2]
		tk, err := p.Admit(context.Background(), pacer.Call{Key: key, Caller: "sync", Transport: "rest", Method: "GET", Target: "/items",
			CallID: fmt.Sprint("c", i), Attempt: 1, MaxWait: 5 * window})
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		now := clocks[i%2].Now()
		if _, err := p.Done(context.Background(), tk, pacer.Outcome{SentAt: now, AnsweredAt: now, Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pacers {
		if err := p.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	var at []time.Time
	view(t, openPostgres(t, url, state.PostgresOptions{}), func(tx ledger.ReadTx) error {
		sends, err := tx.Sends("shared", time.Time{}, 1000)
		for _, s := range sends {
			at = append(at, s.At)
		}
		return err
	})
	if len(at) != calls {
		t.Fatalf("the log holds %d admissions, want the %d calls", len(at), calls)
	}
	most := 0
	for i := range at {
		n := 0
		for _, b := range at[i:] {
			if b.Sub(at[i]) < window {
				n++
			}
		}
		most = max(most, n)
	}
	if most != quota {
		t.Errorf("at most %d admissions in a window of %v, want the quota of %d and no more", most, window, quota)
	}
}

// noPassword fails t when err holds password.
func noPassword(t *testing.T, what string, err error, passwords ...string) {
	t.Helper()
	for _, p := range passwords {
		if err != nil && strings.Contains(err.Error(), p) {
			t.Errorf("%s: the error holds the password %q: %v", what, p, err)
		}
	}
}

// Bad URLs, a wrong password and a missing database fail OpenPostgres
// with errors that say what to fix, and never hold a password.
func badInput(t *testing.T, srv *pgtest.Server) {
	url := srv.CreateDatabase(t)
	host := strings.TrimPrefix(strings.SplitN(url, "/", 4)[2], "mcpq@")
	_, port, _ := strings.Cut(host, ":")
	const secret = "s3cr3t-Pa55"
	for _, c := range []struct {
		name, url string
		says      []string
	}{
		{"a URL that does not parse", "postgres://mcpq:" + secret + "@" + host + ":x/db", []string{"does not parse"}},
		{"a URL with a bad port", "postgres://mcpq@127.0.0.1:99999/db", []string{"not usable"}},
		{"not a URL", "postgres:mcpq@" + host + "/db", []string{"postgres://"}},
		{"a password in the URL", "postgres://mcpq:" + secret + "@" + host + "/db?sslmode=disable", []string{"carries a password", "PGPASSWORD"}},
		{"a password in the query", "postgres://mcpq@" + host + "/db?sslmode=disable&password=" + secret, []string{"carries a password"}},
		{"a missing database", srv.URL("no_such_database"), []string{"no such database", "create it"}},
		{"a password in a keyword/value string", "host=127.0.0.1 port=" + port + " user=mcpq password=" + secret + " dbname=db sslmode=disable",
			[]string{"carries a password", "PGPASSWORD"}},
		{"a quoted password in a keyword/value string", "host=127.0.0.1 password='" + secret + " x' dbname=db", []string{"carries a password"}},
		{"TLS asked of a server without it", strings.Replace(url, "sslmode=disable", "sslmode=require", 1), []string{"TLS could not be set up", "sslmode"}},
		{"a keyword/value string with an unknown keyword", "host=127.0.0.1 pasword=" + secret + " dbname=db",
			[]string{"\"pasword\" is not a PostgreSQL connection keyword", "./NAME"}},
	} {
		_, err := state.OpenPostgres(context.Background(), c.url, state.PostgresOptions{Timeout: 5 * time.Second})
		if err == nil {
			t.Errorf("%s: OpenPostgres succeeded", c.name)
			continue
		}
		t.Logf("%s: %v", c.name, err)
		for _, s := range c.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: got %q, want it to say %q", c.name, err, s)
			}
		}
		noPassword(t, c.name, err, secret, srv.Password())
		if strings.Contains(err.Error(), "is it running") {
			t.Errorf("%s: %q asks whether the server runs; it does", c.name, err)
		}
	}
	t.Run("wrong password", func(t *testing.T) {
		wrong := srv.Password() + "x"
		t.Setenv("PGPASSWORD", wrong)
		_, err := state.OpenPostgres(context.Background(), url, state.PostgresOptions{Timeout: 5 * time.Second})
		if err == nil || !strings.Contains(err.Error(), "PGPASSWORD") || !strings.Contains(err.Error(), "~/.pgpass") {
			t.Errorf("with a wrong password: got %v, want it to say to set PGPASSWORD or ~/.pgpass", err)
		}
		if state.Storage(err) {
			t.Errorf("a refused login is Storage (unavailable): %v; want it told apart", err)
		}
		noPassword(t, "a wrong password", err, wrong, srv.Password())
		t.Logf("a wrong password: %v", err)
	})
}

// An outcome PostgreSQL refuses to record (text with a NUL byte, which
// SQLite would keep, in the call or in an observation of its answer) is
// set aside by the journal: it holds back none of the others, and no View
// waits for it.
func refusedOutcome(t *testing.T, srv *pgtest.Server) {
	pg := openPostgres(t, srv.CreateDatabase(t), state.PostgresOptions{JournalDir: t.TempDir()})
	var first, last int64
	update(t, pg, func(tx ledger.Tx) error {
		var err error
		first, last, err = tx.Reserve("k", 4, t0, t0.Add(time.Hour))
		return err
	}, "k")
	for id := first; id <= last; id++ {
		f := ledger.Finished{Attempt: ledger.Attempt{ID: id, Key: "k", CallID: fmt.Sprint("c", id), Attempt: 1, Caller: "sync",
			State: ledger.Confirmed, Status: 200, Target: "/items"}}
		switch id {
		case first + 1:
			f.Attempt.Target = "/items\x00"
		case last:
			f.Observations = []ledger.ObservationRecord{{Key: "k", AttemptID: id, Status: 200, ReceivedAt: t0,
				Observation: ratelimit.Observation{Policy: "p\x00", Unit: ratelimit.Requests, Remaining: 1, HasRemaining: true}}}
		}
		if err := pg.FinishLater(context.Background(), f); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	states := map[int64]ledger.State{}
	err := pg.View(ctx, func(tx ledger.ReadTx) error {
		sends, err := tx.Sends("k", time.Time{}, 10)
		for _, s := range sends {
			states[s.ID] = s.State
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]ledger.State{first: ledger.Confirmed, first + 1: ledger.Reserved, first + 2: ledger.Confirmed, last: ledger.Reserved}
	if fmt.Sprint(states) != fmt.Sprint(want) {
		t.Errorf("with the second and the last of four outcomes refused: %v, want %v", states, want)
	}
	if err := pg.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// passwordIn returns where in the database at url the password is found:
// in a text or bytea column of a table of mcp-quota's schema.
func passwordIn(t *testing.T, srv *pgtest.Server, url string) []string {
	t.Helper()
	conn := rawConn(t, srv, url)
	rows, err := conn.Query(context.Background(), `SELECT table_name, column_name, data_type FROM information_schema.columns
		WHERE table_schema = 'mcp_quota' AND data_type IN ('text', 'bytea', 'character varying', 'character', 'json', 'jsonb')`)
	if err != nil {
		t.Fatal(err)
	}
	type column struct{ table, name, kind string }
	columns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (column, error) {
		var c column
		return c, r.Scan(&c.table, &c.name, &c.kind)
	})
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, c := range columns {
		where := fmt.Sprintf("strpos(%s::text, $1) > 0", pgx.Identifier{c.name}.Sanitize())
		if c.kind == "bytea" {
			where = fmt.Sprintf("position(convert_to($1, 'UTF8') in %s) > 0", pgx.Identifier{c.name}.Sanitize())
		}
		var n int
		q := fmt.Sprintf("SELECT count(*) FROM %s WHERE %s", pgx.Identifier{"mcp_quota", c.table}.Sanitize(), where)
		if err := conn.QueryRow(context.Background(), q, srv.Password()).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if n > 0 {
			found = append(found, fmt.Sprintf("%s.%s (%d rows)", c.table, c.name, n))
		}
	}
	return found
}

// noPasswordOnServer fails t when the password is in any table of
// mcp-quota's schema in any database of srv, or in a file under dirs.
func noPasswordOnServer(t *testing.T, srv *pgtest.Server, dirs ...string) {
	t.Helper()
	conn := rawConn(t, srv, srv.URL("postgres"))
	rows, err := conn.Query(context.Background(), "SELECT datname FROM pg_database WHERE datname NOT IN ('postgres', 'template0', 'template1')")
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, db := range names {
		if found := passwordIn(t, srv, srv.URL(db)); len(found) > 0 {
			t.Errorf("database %s holds the password in %v", db, found)
		}
	}
	for _, dir := range dirs {
		filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			if err == nil && strings.Contains(string(b), srv.Password()) {
				t.Errorf("%s holds the password", path)
			}
			return nil
		})
	}
	t.Logf("the password is in none of %d databases", len(names))
}

// After the stores of this test's server wrote what they write, the
// password is in none of the tables; the scan finds it where it is.
func passwordInNoTable(t *testing.T, srv *pgtest.Server) {
	url := srv.CreateDatabase(t)
	pg := openPostgres(t, url, state.PostgresOptions{JournalDir: t.TempDir()})
	if _, err := pg.SigningKey(context.Background(), "sessions"); err != nil {
		t.Fatal(err)
	}
	noPasswordOnServer(t, srv)
	update(t, pg, func(tx ledger.Tx) error {
		return tx.AddWarning(ledger.Warning{Key: "k", At: t0, Kind: "x", Reason: reason.Reason{Kind: reason.Said, Said: "planted: " + srv.Password()}})
	})
	// A warning is kept as data (why) and in words (message, for the
	// processes of the previous version): the scan finds it in both.
	found := passwordIn(t, srv, url)
	slices.Sort(found)
	if len(found) != 2 || !strings.HasPrefix(found[0], "warnings.message") || !strings.HasPrefix(found[1], "warnings.why") {
		t.Errorf("a password planted in a warning: found in %v, want warnings.message and warnings.why", found)
	}
}
