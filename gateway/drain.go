package gateway

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/mcp-quota/mcp-quota/rest"
)

// CodeDraining is the problem code of GET /readyz while the host drains.
const CodeDraining = "draining"

// Drain is how a server that stops tells its gateway: once Start is
// called, GET /readyz answers 503, so that a load balancer sends no new
// request; CloseSessions then ends the MCP sessions' event streams, which
// would otherwise hold their connections open past any shutdown.
// The zero Drain is ready.
type Drain struct {
	draining atomic.Bool
	mu       sync.Mutex
	mcp      []sessionCloser
}

type sessionCloser interface{ CloseSessions(context.Context) }

// Start marks the host as draining: /readyz answers 503 from now on.
func (d *Drain) Start() { d.draining.Store(true) }

// Draining reports whether Start was called.
func (d *Drain) Draining() bool { return d.draining.Load() }

// CloseSessions ends the MCP sessions held by this process, and with them
// their GET event streams. The sessions' IDs stay valid elsewhere: another
// host sharing the session secret serves a client that comes back.
func (d *Drain) CloseSessions(ctx context.Context) {
	d.mu.Lock()
	mcp := d.mcp
	d.mu.Unlock()
	for _, s := range mcp {
		s.CloseSessions(ctx)
	}
}

func (d *Drain) add(s sessionCloser) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mcp = append(d.mcp, s)
}

// ready answers GET /readyz: as health (GET /healthz) while d is not
// draining, so that a host whose state cannot be used is not ready either,
// and 503 with the code draining once it is.
func ready(d *Drain, health http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if d != nil && d.Draining() {
			w.Header().Set("Connection", "close")
			rest.WriteProblem(w, http.StatusServiceUnavailable, CodeDraining,
				"This mcp-quota is shutting down: it finishes the calls in flight and closes its listener shortly. Send new calls to another host.",
				nil)
			return
		}
		health(w, r)
	}
}
