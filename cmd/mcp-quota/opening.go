package main

import (
	"context"
	"log/slog"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/telemetry"
	"github.com/mcp-quota/mcp-quota/tools"
)

// An opening is a state opened in the background while the stdio server
// already answers: an assistant waits for initialize before it does
// anything, and opening the state (creating it, on a first start) is the
// largest part of a start that is not the program's loading. Tool calls
// and resource reads wait for it (see tools.Deps.Ready).
type opening struct {
	done chan struct{} // closed once the fields below are final
	app  *app          // nil when the state could not be opened
	err  error         // why it could not
	stop func()        // ends the sweep; set with app
}

// openLater opens the state for the tools of d in the background, and
// sets d's Client, Pacer, DB and Now once it is open; d.Ready waits for
// that. A state that cannot be opened is logged once, and every call
// answers with why.
func (e environment) openLater(ctx context.Context, c common, keys *keystore.Store, log *slog.Logger, tr *telemetry.Tracing, d *tools.Deps) *opening {
	o := &opening{done: make(chan struct{})}
	go func() {
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
	}()
	d.Ready = o.wait
	return o
}

// wait returns once the state is open, or the error that kept it from
// opening, or ctx's error.
func (o *opening) wait(ctx context.Context) error {
	select {
	case <-o.done:
		return o.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close waits for the opening to end, then ends the sweep and closes the
// state.
func (o *opening) close() {
	<-o.done
	if o.app != nil {
		o.stop() // the sweep ends before the state closes
		o.app.close()
	}
}
