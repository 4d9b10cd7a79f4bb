package rest_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/mcp-quota/mcp-quota/gateway"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// TestCancelledCallGetsNoAnswer: a call whose context the server cancels
// while the upstream still holds it and its connection is still open
// (serve closes the connections first, at its shutdown timeout; another
// server embedding the gateway may not) gets no answer at all — its
// exchange is aborted — never an empty 200 its caller would take for the
// upstream's; and its attempt is recorded as failed.
func TestCancelledCallGetsNoAnswer(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 1)
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done() // it never answers in time
	})
	var gc gateway.Config
	s := newStack(t, stackConfig{Upstream: up, Gateway: func(c *gateway.Config) { gc = *c }})

	// A server of its own, whose calls' contexts derive from base, as
	// serve's do.
	base, cancelCalls := context.WithCancel(context.Background())
	defer cancelCalls()
	gs := httptest.NewUnstartedServer(gateway.New(gc))
	gs.Config.BaseContext = func(net.Listener) context.Context { return base }
	gs.Start()
	t.Cleanup(gs.Close)
	go func() {
		<-arrived
		cancelCalls()
	}()

	req, err := http.NewRequest(http.MethodGet, gs.URL+"/k/demo/v1/participants/held", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+syncToken)
	hc := &http.Client{Transport: &http.Transport{}} // a connection of its own: nothing is retried on another
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Errorf("a call cancelled before its answer came was answered %d %q; want no answer", resp.StatusCode, body)
	}

	var attempts []ledger.Attempt
	if err := s.DB.View(t.Context(), func(tx ledger.ReadTx) error {
		var err error
		attempts, err = tx.Activity(ledger.ActivityFilter{Key: "demo", Limit: 10})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(attempts) != 1 || attempts[0].State != ledger.Failed || attempts[0].Target != "/v1/participants/held" {
		t.Errorf("activity: %+v; want the one call, failed", attempts)
	}
}
