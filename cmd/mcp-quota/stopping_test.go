package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestShutdownTimeoutClosesBeforeCancelling: at the shutdown timeout,
// serve closes the connections of the calls still running before it
// cancels their contexts, so that a handler that returns without writing
// once cancelled (as any handler may) leaves its caller with no answer,
// never net/http's empty 200 in its place.
//
// The listener's connections let a response already under way go out
// before they close, as a socket may: a connection closed after its
// call's context was cancelled waits for the response the server writes
// once the handler returned. Cancelling first would answer that 200; a
// connection closed first has none to wait for.
func TestShutdownTimeoutClosesBeforeCancelling(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var call atomic.Pointer[context.Context] // the running call's context
	arrived := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		call.Store(&ctx)
		close(arrived)
		<-ctx.Done() // it never answers in time, and writes nothing once cancelled
	}), ReadHeaderTimeout: 10 * time.Second}

	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- stopping{timeout: time.Nanosecond}.serve(ctx, srv, answeringListener{ln, &call})
	}()

	answer := make(chan string, 1)
	go func() {
		hc := &http.Client{Transport: &http.Transport{}} // a connection of its own
		defer hc.CloseIdleConnections()
		resp, err := hc.Get("http://" + ln.Addr().String() + "/held")
		if err != nil {
			answer <- ""
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answer <- resp.Status + " " + string(body)
	}()
	<-arrived
	stop() // SIGTERM
	if got := <-answer; got != "" {
		t.Errorf("a call still running at the shutdown timeout was answered %q; want no answer", got)
	}
	if err := <-served; err != nil {
		t.Errorf("serve: %v", err)
	}
}

// answeringListener's connections, closed after the context of the call
// they carry was cancelled, first let out the response the server writes
// then.
type answeringListener struct {
	net.Listener
	call *atomic.Pointer[context.Context]
}

func (l answeringListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &answeringConn{Conn: c, call: l.call, wrote: make(chan struct{})}, nil
}

type answeringConn struct {
	net.Conn
	call      *atomic.Pointer[context.Context]
	wrote     chan struct{} // closed by a write after the call's context was cancelled
	wroteOnce sync.Once
	closeOnce sync.Once
}

func (c *answeringConn) cancelled() bool {
	ctx := c.call.Load()
	return ctx != nil && (*ctx).Err() != nil
}

func (c *answeringConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if c.cancelled() {
		c.wroteOnce.Do(func() { close(c.wrote) })
	}
	return n, err
}

func (c *answeringConn) Close() error {
	c.closeOnce.Do(func() {
		if c.cancelled() {
			<-c.wrote
		}
	})
	return c.Conn.Close()
}
