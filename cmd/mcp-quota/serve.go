package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/mcp-quota/mcp-quota/dashboard"
	"github.com/mcp-quota/mcp-quota/gateway"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/metrics"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/telemetry"
	"github.com/mcp-quota/mcp-quota/tools"
)

// serve runs MCP over Streamable HTTP at /mcp and the REST side on one
// listener until ctx ends.
func (e environment) serve(ctx context.Context, args []string) error {
	var c common
	o, err := e.serveFlags(&c, args)
	if err != nil {
		return err
	}
	log, err := e.logger(c)
	if err != nil {
		return err
	}
	// Without --demo the configuration is checked before binding; with it
	// the listener comes first, so that an address in use stops serve
	// before the demo writes any file.
	var keys *keystore.Store
	if !o.demo {
		if keys, err = e.serveKeys(c, o.listen, log); err != nil {
			return err
		}
	}
	ln, scheme, err := o.listener(keys, log)
	if err != nil {
		if o.demo && errors.Is(err, syscall.EADDRINUSE) {
			if held := e.demoHeld(ctx, c); held != nil {
				return held
			}
		}
		return err
	}
	defer ln.Close()
	var d *demoSetup
	if o.demo {
		if d, err = e.startDemo(ctx, c, o.demoListen, o.demoListenSet, log); err != nil {
			return err
		}
		defer d.close()
		c.config = d.configPath
		if keys, err = e.serveKeys(c, o.listen, log); err != nil {
			return err
		}
	}
	oauthSrv, err := oauthServer(keys)
	if err != nil {
		return err
	}
	loopback := isLoopback(ln.Addr())
	a, err := e.open(ctx, c, keys, log, true)
	if err != nil {
		return err
	}
	defer a.close()
	defer a.sweepUntilDone(ctx)() // the sweep ends before the state closes
	tr, endTracing, err := e.tracing(ctx, log)
	if err != nil {
		return err
	}
	defer endTracing()

	drain := &gateway.Drain{}
	mcpServer, m := servedParts(a, keys, tr)
	reload := &reloader{e: e, c: c, listen: o.listen, keys: keys, log: log, loaded: time.Now()}
	defer reload.start(ctx)() // a reload under way ends before what it replaces stops
	h := gateway.New(gateway.Config{Keys: keys, REST: a.rest(), MCP: mcpServer, DB: withDetail(a.db, reload), Log: log,
		Drain: drain, Loopback: loopback, AllowOrigins: splitList(o.origins), Version: version, SessionIdle: o.sessionIdle,
		MaxSessions: o.maxSessions, MaxSessionsPerCaller: o.maxSessionsPerCaller, TrustedProxies: o.trusted,
		SessionSecret: a.sessionSecret(ctx), Metrics: m, OAuth: oauthSrv,
		Dashboard: dashboard.New(dashboard.Config{Keys: keys, Pacer: a.pacer, DB: a.db, Log: log, Clock: a.clock, Secure: gateway.Secure, OIDC: dashboardOIDC(keys, oauthSrv)})})
	srv := gateway.NewServer(ln.Addr().String(), tr.REST(h, isKey(keys)), log)

	e.announceServe(c, keys, scheme+"://"+ln.Addr().String(), d)
	log.Info("serving", "addr", ln.Addr().String(), "keys", keys.KeyNames(), "state", stateShown(e.statePath(c, keys)))
	return stopping{drain: drain, delay: o.drainDelayFor(), timeout: o.shutdownTimeout, log: log}.serve(ctx, srv, ln)
}

// servedParts returns the MCP server serve answers at /mcp and the
// metrics that count every call a's client makes, which tr traces.
func servedParts(a *app, keys *keystore.Store, tr *telemetry.Tracing) (*server.MCPServer, *metrics.Metrics) {
	deps := a.tools(ledger.MCPHTTP, "")
	deps.Watch = tr.MCP("tcp")
	mcpServer := tools.NewServer(deps, version)
	m := metrics.New(keys, a.pacer, a.db)
	m.Clock = a.clock            // the pacer's: ages and times left are read on it
	a.client.Observe = m.Observe // before the first call: every call through this process is counted
	a.client.Watch = tr.Watch()
	return mcpServer, m
}

// serveOptions are serve's flags, checked.
type serveOptions struct {
	listen               string
	demo                 bool
	demoListen           string
	demoListenSet        bool // --demo-listen was given
	origins              string
	sessionIdle          time.Duration
	trusted              []netip.Prefix
	maxSessions          int
	maxSessionsPerCaller int
	tlsCert, tlsKey      string
	drainDelay           time.Duration
	drainDelaySet        bool // --drain-delay was given
	shutdownTimeout      time.Duration
}

// serveFlags parses serve's arguments into c and the options it returns,
// refusing values that cannot work together.
func (e environment) serveFlags(c *common, args []string) (serveOptions, error) {
	fs := e.flags("serve", c, "info")
	listen := fs.String("listen", "127.0.0.1:8787", "address to listen on; non-loopback addresses need [[callers]] tokens")
	demoMode := fs.Bool("demo", false, "start the built-in demo upstream on loopback and a demo key for it")
	demoListen := fs.String("demo-listen", "127.0.0.1:0", "with --demo: the demo upstream's address")
	origins := fs.String("allow-origin", "", "comma-separated browser origins allowed to call (scheme://host:port)")
	sessionIdle := fs.Duration("session-idle", gateway.DefaultSessionIdle, "end an MCP session after this long without a request (its client then starts a new one)")
	proxies := fs.String("trusted-proxy", "", "comma-separated addresses or CIDR prefixes of reverse proxies whose X-Forwarded-Proto and X-Forwarded-For are believed")
	maxSessions := fs.Int("max-sessions", gateway.DefaultMaxSessions, "the most MCP sessions live at once on this host; past it, initialize is refused")
	tlsCert := fs.String("tls-cert", "", "serve HTTPS with this certificate (PEM, its chain after it); read again when the file changes")
	tlsKey := fs.String("tls-key", "", "with --tls-cert: its private key (PEM)")
	drainDelay := fs.Duration("drain-delay", 5*time.Second, "on SIGTERM, how long /readyz answers 503 while calls are still taken, so that a load balancer stops sending before the listener closes (unless set, 0 on a loopback address)")
	shutdownTimeout := fs.Duration("shutdown-timeout", 30*time.Second, "on SIGTERM, how long calls in flight may take to finish after the listener closes; past it they are cancelled")
	maxSessionsPerCaller := fs.Int("max-sessions-per-caller", gateway.DefaultMaxSessionsPerCaller, "the most MCP sessions one caller may have live at once on this host")
	if err := e.parse(fs, args); err != nil {
		return serveOptions{}, err
	}
	if *maxSessions < 1 || *maxSessionsPerCaller < 1 {
		return serveOptions{}, fmt.Errorf("--max-sessions and --max-sessions-per-caller must be at least 1")
	}
	if *drainDelay < 0 || *shutdownTimeout <= 0 {
		return serveOptions{}, fmt.Errorf("--drain-delay must not be negative and --shutdown-timeout must be positive (such as --drain-delay 5s --shutdown-timeout 30s)")
	}
	if (*tlsCert == "") != (*tlsKey == "") {
		return serveOptions{}, fmt.Errorf("--tls-cert and --tls-key go together: give both (the certificate and its private key, PEM), or neither")
	}
	trusted, err := gateway.ParseProxies(*proxies)
	if err != nil {
		return serveOptions{}, fmt.Errorf("--trusted-proxy: %w", err)
	}
	return serveOptions{listen: *listen, demo: *demoMode, demoListen: *demoListen, demoListenSet: flagSet(fs, "demo-listen"),
		origins: *origins, sessionIdle: *sessionIdle, trusted: trusted, maxSessions: *maxSessions, maxSessionsPerCaller: *maxSessionsPerCaller,
		tlsCert: *tlsCert, tlsKey: *tlsKey, drainDelay: *drainDelay, drainDelaySet: flagSet(fs, "drain-delay"), shutdownTimeout: *shutdownTimeout}, nil
}

// listener binds serve's address, with TLS when the flags or, failing
// them, the configuration of keys (nil before it is loaded) name a
// certificate; it returns the listener and its scheme.
func (o serveOptions) listener(keys *keystore.Store, log *slog.Logger) (net.Listener, string, error) {
	certPath, keyPath := o.tlsCert, o.tlsKey
	if certPath == "" && keys != nil {
		certPath, keyPath = keys.TLS() // tls_cert and tls_key in the configuration
	}
	var certs *certFiles
	if certPath != "" {
		var err error
		// nil: the files are looked at again in real time.
		if certs, err = newCertFiles(certPath, keyPath, nil, log); err != nil {
			return nil, "", err
		}
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return nil, "", listenError("serve", o.listen, "--listen", err)
	}
	if certs != nil {
		return tls.NewListener(ln, certs.tlsConfig()), "https", nil
	}
	return ln, "http", nil
}

// drainDelayFor is how long a stop drains: --drain-delay, whose default
// is 0 on a loopback address.
func (o serveOptions) drainDelayFor() time.Duration {
	if !o.drainDelaySet && loopbackAddress(o.listen) {
		return 0 // no load balancer reaches a loopback listener: Ctrl-C stops at once
	}
	return o.drainDelay
}

// announceServe tells stdout where serve answers (at base), with which
// keys and state; the demo (d, nil without --demo) announces itself.
func (e environment) announceServe(c common, keys *keystore.Store, base string, d *demoSetup) {
	if d != nil {
		d.announce(e.stdout, base, stateShown(e.statePath(c, keys)), demoExecutable())
		return
	}
	fmt.Fprintf(e.stdout, "mcp-quota %s\n  MCP (Streamable HTTP): %s/mcp\n  REST:                  %s/k/{key}/\n  keys: %v\n  state: %s\n",
		version, base, base, keys.KeyNames(), stateShown(e.statePath(c, keys)))
	if len(keys.Keys()) == 0 {
		fmt.Fprintf(e.stdout, "  no keys are configured: write %s (see README), or try --demo\n", e.configPath(c))
	}
}

// serveKeys loads the configuration serve runs with, refusing a
// non-loopback address without caller tokens.
func (e environment) serveKeys(c common, listen string, log *slog.Logger) (*keystore.Store, error) {
	keys, err := e.loadKeys(c, log, keysToServe)
	if err != nil {
		return nil, err
	}
	if !loopbackAddress(listen) && len(keys.Callers()) == 0 && keys.OAuth() == nil {
		return nil, fmt.Errorf("refusing to listen on %s without caller tokens: add [[callers]] (or an [oauth] table) to %s, or listen on loopback (--listen 127.0.0.1:8787)", listen, e.configPath(c))
	}
	return keys, nil
}

// serveUntil serves on ln until ctx ends, then shuts down gracefully.
func serveUntil(ctx context.Context, srv *http.Server, ln net.Listener) error {
	return stopping{timeout: 10 * time.Second}.serve(ctx, srv, ln)
}

// stopping is how serve stops once its context ends (SIGTERM or SIGINT):
// /readyz turns unready for delay while the listener still takes calls,
// so that a load balancer stops sending; then the listener closes, the
// MCP sessions end, and calls in flight have timeout to finish. Past it
// their connections are closed, then their contexts cancelled (each
// records its outcome as it ends), and the server waits a little longer
// for their handlers to return.
type stopping struct {
	drain   *gateway.Drain // nil: no /readyz, no sessions to end
	delay   time.Duration
	timeout time.Duration
	log     *slog.Logger // nil: no log
}

// handlersGrace is how long the handlers of calls cancelled at the
// shutdown timeout have to record their outcomes and return.
const handlersGrace = 5 * time.Second

// serve serves srv on ln until ctx ends, then stops as s says.
func (s stopping) serve(ctx context.Context, srv *http.Server, ln net.Listener) error {
	log := s.log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	base, cancelCalls := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelCalls()
	srv.BaseContext = func(net.Listener) context.Context { return base }
	var handlers running
	srv.Handler = handlers.wrap(srv.Handler)

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	if s.drain != nil {
		s.drain.Start()
		log.Info("draining: /readyz answers 503; the listener closes after the drain delay", "drain_delay", s.delay.String())
		if s.delay > 0 {
			t := time.NewTimer(s.delay)
			select {
			case <-t.C:
			case err := <-errc:
				t.Stop()
				return err
			}
		}
	}
	log.Info("shutting down: the listener is closed; calls in flight finish", "shutdown_timeout", s.timeout.String(), "in_flight", handlers.count())
	stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(stop) }()
	if s.drain != nil {
		s.drain.CloseSessions(stop) // their event streams would hold the shutdown to its timeout
	}
	err := <-shut
	if err != nil {
		// Past the bound: close the connections of what still runs, then
		// cancel it, and give the handlers a moment to record their
		// outcomes. Closed first, no connection carries an answer a
		// cancelled handler did not give (net/http's empty 200 for one
		// that returns without writing): its caller sees the exchange cut.
		log.Warn("calls in flight did not finish within the shutdown timeout: cancelling them", "in_flight", handlers.count())
		srv.Close()
		cancelCalls()
		grace, cancel := context.WithTimeout(context.WithoutCancel(ctx), handlersGrace)
		defer cancel()
		if handlers.wait(grace) != nil {
			log.Warn("calls still running after their cancellation: their slots stay counted until the next sweep", "in_flight", handlers.count())
		}
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// running counts the handlers running.
type running struct {
	mu   sync.Mutex
	n    int
	zero chan struct{} // closed when n drops to 0; nil when none waits
}

func (r *running) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.n++
		r.mu.Unlock()
		defer r.done()
		h.ServeHTTP(w, req)
	})
}

func (r *running) done() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n--; r.n == 0 && r.zero != nil {
		close(r.zero)
		r.zero = nil
	}
}

func (r *running) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// wait returns when no handler runs, or with ctx's error when it ends first.
func (r *running) wait(ctx context.Context) error {
	r.mu.Lock()
	if r.n == 0 {
		r.mu.Unlock()
		return nil
	}
	if r.zero == nil {
		r.zero = make(chan struct{})
	}
	zero := r.zero
	r.mu.Unlock()
	select {
	case <-zero:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// stdio speaks MCP over stdin and stdout until stdin closes or ctx ends.
// stdout belongs to the protocol: logs go to stderr.
func (e environment) stdio(ctx context.Context, args []string, stdin io.Reader) error {
	var c common
	fs := e.flags("stdio", &c, "warn")
	def := e.getenv("MCP_QUOTA_CALLER")
	if def == "" {
		def = "stdio"
	}
	caller := fs.String("caller", def, "the caller's name in the activity (env MCP_QUOTA_CALLER)")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	log, err := e.logger(c)
	if err != nil {
		return err
	}
	keys, err := e.loadKeys(c, log, keysForStdio)
	if err != nil {
		return err
	}
	tr, endTracing, err := e.tracing(ctx, log)
	if err != nil {
		return err
	}
	defer endTracing()
	// initialize is answered before the state opens (see openLater).
	deps := &tools.Deps{Keys: keys, Log: log, Transport: ledger.Stdio, LocalCaller: *caller, Watch: tr.MCP("pipe"), SkipOutputCheck: true}
	o := e.openLater(ctx, c, keys, log, tr, deps)
	defer o.close()
	s := server.NewStdioServer(tools.NewServer(deps, version))
	s.SetErrorLogger(slogLogger(log))
	err = s.Listen(ctx, stdin, o.answered(e.stdout))
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}
