package main

import (
	"context"
	"io"
	"log/slog"
	"sync"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/telemetry"
	"github.com/mcp-quota/mcp-quota/tools"
)

// An opening is a state opened in the background while the stdio server
// already answers: an assistant waits for initialize before it does
// anything, and opening the state (creating it, on a first start) is the
// largest part of a start that is not the program's loading. The open
// begins once the first answer is written (see answered), so it does not
// compete with that answer for the CPU, or as soon as a tool call or a
// resource read waits for it (see tools.Deps.Ready), whichever comes
// first.
type opening struct {
	run   func(*opening) // opens the state, sets the fields below, closes done
	begin sync.Once      // starts run, or ends an opening that never began
	done  chan struct{}  // closed once the fields below are final
	app   *app           // nil when the state could not be opened
	err   error          // why it could not
	stop  func()         // ends the sweep; set with app
}

// openLater prepares the opening of the state for the tools of d: once
// it begins, it sets d's Client, Pacer, DB and Clock when the state is
// open; d.Ready begins it and waits for that. A state that cannot be
// opened is logged once, and every call answers with why.
func (e environment) openLater(ctx context.Context, c common, keys *keystore.Store, log *slog.Logger, tr *telemetry.Tracing, d *tools.Deps) *opening {
	o := &opening{done: make(chan struct{}), run: func(o *opening) {
		defer close(o.done)
		a, err := e.open(ctx, c, keys, log, true)
		if err != nil {
			if ctx.Err() == nil {
				log.Error("serving MCP without a state file: every tool call answers with this error", "error", err)
			}
			o.err = err
			return
		}
		a.client.Watch = tr.Watch()
		ready := a.tools(d.Transport, d.LocalCaller)
		d.Client, d.Pacer, d.DB, d.Clock = ready.Client, ready.Pacer, ready.DB, ready.Clock
		o.app, o.stop = a, a.sweepUntilDone(ctx)
	}}
	d.Ready = o.wait
	return o
}

// start begins the opening in the background, once.
func (o *opening) start() {
	o.begin.Do(func() { go o.run(o) })
}

// answered returns w, which begins the opening once its first write
// returns: the server's first answer (to initialize) is then on its way.
func (o *opening) answered(w io.Writer) io.Writer {
	return startingWriter{w: w, o: o}
}

type startingWriter struct {
	w io.Writer
	o *opening
}

func (s startingWriter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	s.o.start()
	return n, err
}

// wait begins the opening if it has not begun, and returns once the
// state is open, or the error that kept it from opening, or ctx's error.
func (o *opening) wait(ctx context.Context) error {
	o.start()
	select {
	case <-o.done:
		return o.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close waits for an opening that began to end, then ends the sweep and
// closes the state; an opening that never began never will.
func (o *opening) close() {
	o.begin.Do(func() { close(o.done) })
	<-o.done
	if o.app != nil {
		o.stop() // the sweep ends before the state closes
		o.app.close()
	}
}
