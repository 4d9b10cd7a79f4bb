package rest_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/gateway"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// A sync job calling a key far from its limits as fast as it can is
// admitted from leases: calls share an admission time, every
// answer still carries the shared budget, never more generous than what
// the upstream has left, and every call is recorded with its outcome.
// mcp-quota's clock moves a millisecond a call, so that the pace a lease
// follows is the same on any machine.
func TestBusySyncJobIsLeased(t *testing.T) {
	const quota = 100_000
	clk := testkit.NewClock(time.Now())
	s := newStack(t, stackConfig{Demo: demo.Config{Quota: quota, Window: time.Hour}, Keys: benchKeys(true),
		Gateway: func(c *gateway.Config) { c.MaxConcurrent = 1000 }, QuietLog: true, Clock: clk})
	const calls = 100
	for i := range calls {
		clk.Advance(time.Millisecond)
		resp, body := s.do(t, "GET", "/k/demo/v1/participants/p-000001", syncToken, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, body)
		}
		if missing := missingRateLimitFields(resp.Header); len(missing) > 0 {
			t.Fatalf("call %d lacks %v", i, missing)
		}
		r, err := strconv.ParseInt(resp.Header.Get("X-RateLimit-Remaining"), 10, 64)
		if err != nil {
			t.Fatalf("call %d: X-RateLimit-Remaining %q: %v", i, resp.Header.Get("X-RateLimit-Remaining"), err)
		}
		if left := int64(quota - s.upstreamRequests()); r > left {
			t.Errorf("call %d says %d calls remain; the upstream has %d left", i, r, left)
		}
	}
	if err := s.Pacer.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var list []ledger.Attempt
	err := s.DB.View(context.Background(), func(tx ledger.ReadTx) error {
		var err error
		list, err = tx.Activity(ledger.ActivityFilter{Key: "demo", Limit: 10 * calls})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != calls {
		t.Errorf("the activity holds %d attempts, want %d", len(list), calls)
	}
	admittedAt := map[time.Time]bool{}
	for _, a := range list {
		admittedAt[a.At] = true
		if a.State != ledger.Confirmed || a.Caller != "sync" || a.Transport != "rest" || a.Status != 200 {
			t.Fatalf("attempt %d is recorded as %s by %q over %q, status %d; want confirmed 200 by sync over rest",
				a.ID, a.State, a.Caller, a.Transport, a.Status)
		}
	}
	// At a call a millisecond, a lease (pacer.LeaseTime at most) holds
	// pacer.LeaseMax slots: all but the first calls share a few admissions.
	if len(admittedAt) > calls-16 {
		t.Errorf("%d calls were admitted at %d different times: want a lease's 16 calls at least to share one", calls, len(admittedAt))
	}
	t.Logf("%d calls admitted at %d different times", calls, len(admittedAt))
	if got := s.upstreamRequests(); got != calls {
		t.Errorf("the upstream got %d requests, want %d", got, calls)
	}
}
