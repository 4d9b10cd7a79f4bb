package upstream

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
)

// stalling is a store whose first transaction, once committed, is
// followed by a stall of the machine: clk moves on by stall before the
// process goes on.
type stalling struct {
	ledger.Store
	clk   *testkit.Clock
	mu    sync.Mutex
	stall time.Duration
}

func (s *stalling) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	err := s.Store.Update(ctx, fn, keys...)
	s.mu.Lock()
	stall := s.stall
	s.stall = 0
	s.mu.Unlock()
	s.clk.Advance(stall)
	return err
}

// A request whose process stalled between its admission and its send,
// longer than the margin the admission counted with, is not sent as it
// was admitted: its attempt ends "not sent", and the call is admitted
// again and goes, once — the attempt it replaces, counted, does not
// hold it back (the key allows one call per 4 s).
func TestLateSendIsAdmittedAgainBeforeItGoes(t *testing.T) {
	f := &fake{answer: func(int, *http.Request) *http.Response { return respond(http.StatusOK) }}
	db := testkit.OpenState(t, state.Open)
	clk := testkit.NewClock(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC))
	store := &stalling{Store: db, clk: clk, stall: 700 * time.Millisecond}
	c := New(pacer.New(store, pacer.WithClock(clk)), nil)
	c.Clock, c.Transport = clk, f
	s, err := keystore.Parse([]byte(testkit.Keys(testkit.Key{Name: "k", BaseURL: "https://api.example/base", SecretEnv: "S", Auth: "bearer", MaxRate: 1000,
		Policies: []testkit.Policy{{Name: "p", Quota: 1, Window: 4 * time.Second}}})), keystore.Env{Getenv: func(string) string { return secret }})
	if err != nil {
		t.Fatal(err)
	}
	k, _ := s.Key("k")

	resp, err := c.Do(context.Background(), k, Request{Caller: "a", Transport: "test", Path: "/x", MaxWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(f.requests) != 1 || resp.Attempts != 2 {
		t.Fatalf("status %d, %d requests sent, %d attempts; want 200, 1 sent, 2 attempts: %+v", resp.StatusCode, len(f.requests), resp.Attempts, activity(t, db))
	}
	list := activity(t, db)
	if got, want := strings.Join(states(list), ","), "failed,confirmed"; got != want {
		t.Fatalf("activity = %s, want %s", got, want)
	}
	late := list[1]
	if late.Reason.Kind != reason.Late || late.Reason.For != 700*time.Millisecond || !late.SentAt.IsZero() || late.Status != 0 {
		t.Errorf("the late attempt: %+v, sent at %v, status %d; want it not sent, late by 700ms after its admission", late.Reason, late.SentAt, late.Status)
	}
	if sent := list[0]; sent.CallID != late.CallID || sent.Attempt != 2 || sent.SentAt.Sub(sent.At) > 0 {
		t.Errorf("the attempt that went: call %s attempt %d, admitted at %v, sent at %v; want the same call's second, sent as admitted",
			sent.CallID, sent.Attempt, sent.At, sent.SentAt)
	}
}

// failing is a store whose nth transaction fails as a database that
// stopped answering does: after committing (when committed), or before.
type failing struct {
	ledger.Store
	n         int  // the transaction that fails, from 1
	committed bool // whether it commits first
	seen      int
}

func (s *failing) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	s.seen++
	if s.seen != s.n {
		return s.Store.Update(ctx, fn, keys...)
	}
	if s.committed {
		if err := s.Store.Update(ctx, fn, keys...); err != nil {
			return err
		}
	}
	return fmt.Errorf("state: the connection was cut: %w", ledger.ErrUnavailable)
}

// The outcome of a call that went upstream, when its transaction fails
// for a database that did not answer, is tried once more — unless the
// failed one committed after all: it is in the activity once, and the
// call is answered.
func TestOutcomeOfASentCallIsTriedAgain(t *testing.T) {
	for _, committed := range []bool{false, true} {
		t.Run(fmt.Sprintf("committed %v", committed), func(t *testing.T) {
			f := &fake{answer: func(int, *http.Request) *http.Response {
				return respond(http.StatusOK, "RateLimit-Policy", `"p";q=10;w=60`, "RateLimit", `"p";r=9;t=60`)
			}}
			db := testkit.OpenState(t, state.Open)
			c := New(pacer.New(&failing{Store: db, n: 2, committed: committed}), nil) // 1: the admission, 2: the outcome
			c.Transport = f
			resp, err := c.Do(context.Background(), newKey(t, "bearer"), Request{Caller: "a", Transport: "test", Path: "/x"})
			if err != nil {
				t.Fatalf("the call: %v", err)
			}
			resp.Body.Close()
			list := activity(t, db)
			if len(list) != 1 || list[0].State != ledger.Confirmed || list[0].Status != http.StatusOK {
				t.Fatalf("activity %+v; want the call confirmed, 200", list)
			}
			var obs []ledger.ObservationRecord
			db.View(context.Background(), func(tx ledger.ReadTx) error {
				obs, err = tx.ObservationsOf("k", list[0].ID)
				return err
			})
			if len(obs) != 1 {
				t.Errorf("the answer's observations are recorded %d times, want once", len(obs))
			}
		})
	}
}
