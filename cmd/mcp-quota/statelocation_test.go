package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/pgtest"
)

// TestStateKeywordValue: a PostgreSQL keyword/value connection string is
// the PostgreSQL database it names, not a SQLite file named after it; a
// one-shot command that fails on it leaves no file and no journal
// directory behind; and the string's spellings of one database share one
// journal directory.
func TestStateKeywordValue(t *testing.T) {
	srv := pgtest.Start(t)
	t.Setenv("PGPASSWORD", srv.Password())
	u, err := url.Parse(srv.CreateDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Chdir(dir)
	states := filepath.Join(dir, "states")
	env := func(k string) string {
		if k == "XDG_STATE_HOME" {
			return states
		}
		return ""
	}
	kv := fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable", u.Hostname(), u.Port(), u.User.Username(), strings.TrimPrefix(u.Path, "/"))

	out, errOut, err := runCmd(t, env, "status", "--state", kv)
	if err != nil {
		t.Fatalf("status --state %q: %v (stderr %q)", kv, err, errOut)
	}
	t.Logf("status:\n%s", out)
	if entries, _ := os.ReadDir(dir); len(entries) != 0 && !(len(entries) == 1 && entries[0].Name() == "states") {
		t.Errorf("status on a PostgreSQL connection string left %v in the working directory; want nothing (no SQLite file)", entries)
	}

	for _, bad := range []string{
		fmt.Sprintf("host=%s port=%s user=%s dbname=no_such_database sslmode=disable", u.Hostname(), u.Port(), u.User.Username()),
		strings.Replace(srv.URL("no_such_database"), "postgres://", "postgresql://", 1),
	} {
		_, _, err := runCmd(t, env, "activity", "--state", bad)
		if err == nil || !strings.Contains(err.Error(), "no such database") {
			t.Errorf("activity --state %q: %v; want it to say there is no such database", bad, err)
		}
	}
	journals := filepath.Join(states, "mcp-quota", "journals")
	if entries, err := os.ReadDir(journals); err == nil && len(entries) > 0 || err != nil && !errors.Is(err, os.ErrNotExist) {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("failed one-shot commands left %v under %s (%v); want nothing", names, journals, err)
	}
}

// TestServeSaysOnceThatTheDatabaseDoesNotAnswer: serve started while its
// PostgreSQL state does not answer says why once, not once for each
// part of it that needs the state.
func TestServeSaysOnceThatTheDatabaseDoesNotAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s := newSetup(t, demoKey("https://api.example", 120, time.Minute))
	s.state = "postgres://mq@" + addr + "/mq?sslmode=disable"
	s.env = append(s.env, "XDG_STATE_HOME="+t.TempDir())
	_, logs := s.serve(t)
	var before string
	for { // the log up to "serving": what serve says as it starts (no sleep: serve logs it before it answers)
		if l := logs.String(); strings.Contains(l, "msg=serving") {
			before = l[:strings.Index(l, "msg=serving")]
			break
		}
		runtime.Gosched()
	}
	if n := strings.Count(before, "connection refused"); n != 1 {
		t.Errorf("serve said %d times that the database refused the connection; want once:\n%s", n, before)
	}
}

// TestCommandsWaitLongerThanACall: status and activity, run by a person,
// wait for a PostgreSQL state up to commandStateTimeout even when
// state_timeout, the bound of an agent's call, is shorter. The database
// here accepts connections and never answers; the command is stopped by
// its context before either bound, and says which bound it kept.
func TestCommandsWaitLongerThanACall(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { // accept, read, never answer
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { conn.Close() })
			go io.Copy(io.Discard, conn)
		}
	}()
	cfg := demoConfig(demoKey("https://api.example", 120, time.Minute))
	cfg.State, cfg.StateTimeout = "postgres://mq@"+ln.Addr().String()+"/mq?sslmode=disable", 100*time.Millisecond
	s := setupOf(t, cfg)
	s.env = append(s.env, "XDG_STATE_HOME="+t.TempDir())

	for _, command := range []string{"status", "activity"} {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		var out, errOut strings.Builder
		err := run(ctx, []string{command, "--config", s.config}, strings.NewReader(""), &out, &errOut, s.getenv)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "did not answer within "+commandStateTimeout.String()) {
			t.Errorf("%s on a database that never answers, with state_timeout 100ms: %v; want it to have waited up to %s", command, err, commandStateTimeout)
		}
	}
}
