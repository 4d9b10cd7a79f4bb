package state_test

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
	"github.com/mcp-quota/mcp-quota/state/sqlite"
)

// The words a gate, a warning and an attempt held before reasons were
// kept as data.
const (
	oldGateWords    = "the upstream answered 429 and asked to wait 60 s (Retry-After)"
	oldWarningWords = "key 'k' hit a limit the upstream never announced ('hidden'); it is now enforced locally as 10 calls per 60 s"
	oldAttemptWords = "refused locally, retry after 9 s: all 1 calls per 10 s allowed by policy 'default' are used"
)

// oldReasonRows are a gate, a warning and an attempt as a schema before
// reasons were data held them, with the time format of both back ends
// (microseconds).
func oldReasonRows() []string {
	at := t0.UnixMicro()
	quoted := func(s string) string { return strings.ReplaceAll(s, "'", "''") }
	return []string{
		fmt.Sprintf(`INSERT INTO gates (key, scope, until, reason, source, set_at) VALUES ('k', '', %d, '%s', 'retry-after', %d)`,
			t0.Add(time.Hour).UnixMicro(), quoted(oldGateWords), at),
		fmt.Sprintf(`INSERT INTO warnings (key, at, kind, message) VALUES ('k', %d, 'hidden-limit', '%s')`, at, quoted(oldWarningWords)),
		fmt.Sprintf(`INSERT INTO attempts (call_id, attempt, key, caller, transport, method, target, state, reason, at)
			VALUES ('old', 1, 'k', 'agent', 'rest', 'GET', '/items', 'rejected_local', '%s', %d)`, quoted(oldAttemptWords), at),
	}
}

// checkReasonsMigrated checks that s reads the rows oldReasonRows wrote
// as their words (reason.Said), and that a gate and a warning written now
// read back as data.
func checkReasonsMigrated(t *testing.T, s ledger.Store) {
	t.Helper()
	said := func(words string) reason.Reason { return reason.Reason{Kind: reason.Said, Said: words} }
	read := func() (ledger.Gate, ledger.Warning) {
		var gates []ledger.Gate
		var warnings []ledger.Warning
		view(t, s, func(tx ledger.ReadTx) error {
			var err error
			if gates, err = tx.Gates("k", t0); err != nil {
				return err
			}
			warnings, err = tx.Warnings("k", t0.Add(-time.Second))
			return err
		})
		if len(gates) != 1 || len(warnings) < 1 {
			t.Fatalf("gates %+v, warnings %+v; want one gate and a warning", gates, warnings)
		}
		return gates[0], warnings[0]
	}
	g, w := read()
	if diff := cmp.Diff(g.Reason, said(oldGateWords)); diff != "" || g.Source != ledger.RetryAfterGate {
		t.Errorf("the gate written before: source %q, reason (-got +want):\n%s", g.Source, diff)
	}
	if diff := cmp.Diff(w.Reason, said(oldWarningWords)); diff != "" || w.Kind != "hidden-limit" {
		t.Errorf("the warning written before: kind %q, reason (-got +want):\n%s", w.Kind, diff)
	}
	if got := g.Reason.String(); got != oldGateWords {
		t.Errorf("the gate written before says %q, want %q", got, oldGateWords)
	}

	gateWhy := reason.Reason{Kind: reason.CircuitOpen, Key: "k", Failures: 5, For: 2 * time.Hour}
	warnWhy := reason.Reason{Kind: reason.HiddenLimit, Key: "k", Policy: "hidden", Limit: 10, Window: time.Minute}
	update(t, s, func(tx ledger.Tx) error {
		if err := tx.PutGate(ledger.Gate{Key: "k", Until: t0.Add(2 * time.Hour), Source: ledger.CircuitGate, SetAt: t0, Reason: gateWhy}); err != nil {
			return err
		}
		return tx.AddWarning(ledger.Warning{Key: "k", At: t0.Add(time.Second), Kind: "hidden-limit", Reason: warnWhy})
	}, "k")
	g, w = read()
	if diff := cmp.Diff(g.Reason, gateWhy); diff != "" {
		t.Errorf("a gate written after (-got +want):\n%s", diff)
	}
	if diff := cmp.Diff(w.Reason, warnWhy); diff != "" {
		t.Errorf("a warning written after (-got +want):\n%s", diff)
	}
	if got := w.Reason.String(); got != oldWarningWords {
		t.Errorf("the same warning written as data says %q; want the words it said before, %q", got, oldWarningWords)
	}
	checkAttemptReasonsMigrated(t, s)
}

// newAttemptWhy is the reason of the attempt checkAttemptReasonsMigrated
// writes: the same refusal the attempt oldReasonRows wrote, as data.
var newAttemptWhy = reason.RefusedFor(9*time.Second, reason.Reason{Kind: reason.WindowSpent, Policy: "default", Limit: 1, Window: 10 * time.Second})

// checkAttemptReasonsMigrated checks that s reads the attempt
// oldReasonRows wrote as its words (reason.Said), and that an attempt
// written now reads back as data, through each way the state writes one.
func checkAttemptReasonsMigrated(t *testing.T, s ledger.Store) {
	t.Helper()
	activity := func() map[string]reason.Reason {
		var list []ledger.Attempt
		view(t, s, func(tx ledger.ReadTx) (err error) {
			list, err = tx.Activity(ledger.ActivityFilter{Key: "k"})
			return err
		})
		whys := map[string]reason.Reason{}
		for _, a := range list {
			whys[a.CallID] = a.Reason
		}
		return whys
	}
	if diff := cmp.Diff(activity()["old"], reason.Reason{Kind: reason.Said, Said: oldAttemptWords}); diff != "" {
		t.Errorf("the attempt written before (-got +want):\n%s", diff)
	}
	failed := reason.Reason{Kind: reason.Failed, Error: "dial tcp: connection refused"}
	update(t, s, func(tx ledger.Tx) error {
		if _, err := tx.InsertAttempt(ledger.Attempt{CallID: "new", Attempt: 1, Key: "k", Caller: "agent", State: ledger.RejectedLocal,
			Reason: newAttemptWhy, At: t0.Add(time.Second)}); err != nil {
			return err
		}
		id, err := tx.InsertAttempt(ledger.Attempt{CallID: "failed", Attempt: 1, Key: "k", Caller: "agent", State: ledger.Admitted,
			At: t0.Add(2 * time.Second)})
		if err != nil {
			return err
		}
		return tx.FinishAttempt(id, ledger.Failed, failed, 0, t0.Add(2*time.Second), time.Time{})
	}, "k")
	got := activity()
	if diff := cmp.Diff(got["new"], newAttemptWhy); diff != "" {
		t.Errorf("an attempt written after (-got +want):\n%s", diff)
	}
	if diff := cmp.Diff(got["failed"], failed); diff != "" {
		t.Errorf("an attempt finished after (-got +want):\n%s", diff)
	}
	if got := got["new"].String(); got != oldAttemptWords {
		t.Errorf("the same refusal written as data says %q; want the words it said before, %q", got, oldAttemptWords)
	}
}

// A file whose gates and warnings were written before reasons were kept
// as data reads them back as their words; what is written after it is
// opened reads back as data.
func TestReasonsOfAnOlderFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	raw, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	names, err := fs.Glob(sqlite.Migrations, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	const before = 12 // the migration before reasons were data (0013)
	for _, name := range names[:before] {
		body, err := sqlite.Migrations.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := raw.Exec(string(body)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	steps := append(oldReasonRows(), fmt.Sprintf("PRAGMA user_version = %d", before))
	for _, s := range steps {
		if _, err := raw.Exec(s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	db := open(t, path)
	checkReasonsMigrated(t, db)
	var words, attemptWords string
	if err := raw.QueryRow(`SELECT reason FROM gates WHERE key = 'k'`).Scan(&words); err != nil {
		t.Fatal(err)
	}
	if err := raw.QueryRow(`SELECT reason FROM attempts WHERE call_id = 'new'`).Scan(&attemptWords); err != nil {
		t.Fatal(err)
	}
	checkOlderWords(t, words, attemptWords)
}

// The PostgreSQL schema before reasons were data (version 6), with a gate
// and a warning in it, is migrated in place: they read back as their
// words, and what is written after reads back as data.
func reasonsMigrated(t *testing.T, srv *pgtest.Server) {
	ctx := context.Background()
	url := srv.CreateDatabase(t)
	conn := rawConn(t, srv, url)
	schemaAt(t, conn, 6)
	for _, s := range append([]string{`INSERT INTO keys (key) VALUES ('k')`}, oldReasonRows()...) {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	pg := openPostgres(t, url, state.PostgresOptions{})
	if v, _ := version(t, conn); v != latestSchema(t) {
		t.Fatalf("migrated to version %d, want %d", v, latestSchema(t))
	}
	checkReasonsMigrated(t, pg)
	var words, attemptWords string
	if err := conn.QueryRow(ctx, `SELECT reason FROM mcp_quota.gates WHERE key = 'k'`).Scan(&words); err != nil && err != pgx.ErrNoRows {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT reason FROM mcp_quota.attempts WHERE call_id = 'new'`).Scan(&attemptWords); err != nil {
		t.Fatal(err)
	}
	checkOlderWords(t, words, attemptWords)
}

// checkOlderWords checks the words kept beside the gate and the attempt
// checkReasonsMigrated wrote as data: what a process of the previous
// version, which reads only the words, shows while hosts are upgraded one
// at a time.
func checkOlderWords(t *testing.T, gate, attempt string) {
	t.Helper()
	want := reason.Reason{Kind: reason.CircuitOpen, Key: "k", Failures: 5, For: 2 * time.Hour}.String()
	if gate != want {
		t.Errorf("a gate written as data keeps the words %q beside it, want %q for processes of the previous version", gate, want)
	}
	if attempt != oldAttemptWords {
		t.Errorf("an attempt written as data keeps the words %q beside it, want %q for processes of the previous version", attempt, oldAttemptWords)
	}
}
