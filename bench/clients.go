package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"golang.org/x/time/rate"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/state"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// A Client is one of the compared ways of calling the upstream: a column
// of the benchmark.
type Client string

// The clients, each configured as its users would configure it for an
// API that documents "Quota calls per Window".
const (
	// Naive sends again at once until a call is accepted: no waiting, no
	// header reading.
	Naive Client = "naive"
	// Retryable is github.com/hashicorp/go-retryablehttp's NewClient with
	// its default policy: up to 4 retries of a 429 or 5xx, waiting what
	// Retry-After says on a 429 or 503 and 1 s, 2 s, 4 s… (at most 30 s)
	// otherwise; after the last retry it gives up and the caller calls
	// again.
	Retryable Client = "retryablehttp"
	// Rate is golang.org/x/time/rate set to the documented limit:
	// rate.Every(Window/Quota) with a burst of 1 (a larger burst lets a
	// token bucket exceed Quota in a rolling window), waited on before
	// every attempt; a refused call is sent again after the next wait. It
	// reads no header.
	Rate Client = "rate"
	// MCPQuota is mcp-quota's call path: upstream.Client over a
	// pacer.Pacer and a state file (shared by every process of the
	// workload), with the key configured with the documented policy, the
	// behaviour's header profile and a max_rate high enough never to bind.
	MCPQuota Client = "mcp-quota"
)

// Clients returns every client, in column order.
func Clients() []Client { return []Client{Naive, Retryable, Rate, MCPQuota} }

// ParseClient returns the client named s.
func ParseClient(s string) (Client, error) {
	var names []string
	for _, c := range Clients() {
		if string(c) == s {
			return c, nil
		}
		names = append(names, string(c))
	}
	return "", fmt.Errorf("unknown client %q (want one of %s)", s, strings.Join(names, ", "))
}

// Title is the client's column heading.
func (c Client) Title() string {
	switch c {
	case Naive:
		return "naive"
	case Retryable:
		return "go-retryablehttp"
	case Rate:
		return "x/time/rate"
	case MCPQuota:
		return "mcp-quota"
	}
	return string(c)
}

// Settings of the mcp-quota key the benchmark configures.
const (
	// benchMaxRate is the key's max_rate: far above any pace a behaviour
	// allows (at most 10 calls/s at the default scale), so that it never
	// binds and the pacer's own decisions are what is measured.
	benchMaxRate = 1000
	// callPath is what every client calls: the demo's cheapest endpoint.
	callPath = "v1/echo"
	// secretEnv names the key's credential in the keystore.Env the
	// benchmark hands keystore.Parse.
	secretEnv = "MCP_QUOTA_BENCH_SECRET"
)

// A spec says how one caller of a run reaches the upstream. Workers
// receive it as JSON.
type spec struct {
	Client    Client        `json:"client"`
	Caller    string        `json:"caller"` // "agent" or "sync"
	Behaviour string        `json:"behaviour"`
	Scale     Scale         `json:"scale"`
	BaseURL   string        `json:"base_url"` // ends in "/"
	Token     string        `json:"token"`    // the run's own random bearer token
	StatePath string        `json:"state_path"`
	MaxWait   time.Duration `json:"max_wait"` // what an mcp-quota caller will wait for one admission
	Verbose   bool          `json:"verbose"`  // log mcp-quota's warnings to the diagnostics
}

// A caller makes one call through a client: it returns true when the
// upstream accepted it, false when the client gave up (the caller then
// calls again), and an error when no answer came.
type caller interface {
	call(ctx context.Context) (bool, error)
	close()
}

// newCaller sets up the client s names. diag receives diagnostics.
func newCaller(ctx context.Context, s spec, diag io.Writer) (caller, error) {
	url := s.BaseURL + callPath
	switch s.Client {
	case Naive:
		return &direct{hc: &http.Client{Transport: newTransport()}, url: url, token: s.Token}, nil
	case Rate:
		lim := rate.NewLimiter(rate.Every(s.Scale.Window/time.Duration(s.Scale.Quota)), 1)
		return &limited{direct: direct{hc: &http.Client{Transport: newTransport()}, url: url, token: s.Token}, lim: lim}, nil
	case Retryable:
		rc := retryablehttp.NewClient()
		rc.Logger = nil // silence; the policy stays the default
		return &retrying{rc: rc, url: url, token: s.Token}, nil
	case MCPQuota:
		return newQuota(ctx, s, diag)
	}
	return nil, fmt.Errorf("unknown client %q", s.Client)
}

func newTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 16
	return t
}

// direct sends one GET per call.
type direct struct {
	hc    *http.Client
	url   string
	token string
}

func (d *direct) call(ctx context.Context) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url, nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("Authorization", "Bearer "+d.token)
	resp, err := d.hc.Do(req)
	if err != nil {
		return false, err
	}
	return accepted(resp), nil
}

func (d *direct) close() { d.hc.CloseIdleConnections() }

// accepted drains and closes resp, so its connection is reused, and
// reports whether the upstream accepted the call: an admitted GET
// /v1/echo is always 200.
func accepted(resp *http.Response) bool {
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// limited waits for its limiter before every attempt.
type limited struct {
	direct
	lim *rate.Limiter
}

func (l *limited) call(ctx context.Context) (bool, error) {
	if err := l.lim.Wait(ctx); err != nil {
		return false, err
	}
	return l.direct.call(ctx)
}

// retrying is go-retryablehttp with its defaults.
type retrying struct {
	rc    *retryablehttp.Client
	url   string
	token string
}

func (r *retrying) call(ctx context.Context) (bool, error) {
	req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodGet, r.url, nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("Authorization", "Bearer "+r.token)
	resp, err := r.rc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		return false, nil // it gave up after its retries; the caller calls again
	}
	return accepted(resp), nil
}

func (r *retrying) close() { r.rc.HTTPClient.CloseIdleConnections() }

// quota is mcp-quota's call path.
type quota struct {
	db     *state.DB
	client *upstream.Client
	key    *keystore.Key
	caller string
	wait   time.Duration
}

// keyConfig is the mcp-quota configuration of the benchmark's key.
func keyConfig(s spec) (string, error) {
	b, err := BehaviourNamed(s.Behaviour)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf(`[[keys]]
name = "bench"
base_url = %q
secret_env = %q
auth = "bearer"
profile = %q
max_rate = %d
  [[keys.policies]]
  name = %q
  quota = %d
  window = %q
`, s.BaseURL, secretEnv, b.Profile, benchMaxRate, b.Policy, s.Scale.Quota, s.Scale.Window.String()), nil
}

func newQuota(ctx context.Context, s spec, diag io.Writer) (*quota, error) {
	cfg, err := keyConfig(s)
	if err != nil {
		return nil, err
	}
	keys, err := keystore.Parse([]byte(cfg), keystore.Env{Getenv: func(name string) string {
		if name == secretEnv {
			return s.Token
		}
		return ""
	}})
	if err != nil {
		return nil, err
	}
	k, err := keys.Key("bench")
	if err != nil {
		return nil, err
	}
	db, err := state.Open(ctx, s.StatePath)
	if err != nil {
		return nil, err
	}
	log := slog.New(slog.DiscardHandler)
	if s.Verbose {
		log = slog.New(slog.NewTextHandler(diag, &slog.HandlerOptions{Level: slog.LevelWarn})).With("caller", s.Caller)
	}
	return &quota{db: db, client: upstream.New(pacer.New(db), log), key: k, caller: s.Caller, wait: s.MaxWait}, nil
}

func (q *quota) call(ctx context.Context) (bool, error) {
	resp, err := q.client.Do(ctx, q.key, upstream.Request{Caller: q.caller, Transport: "rest", Path: callPath, MaxWait: q.wait})
	var pause *pacer.PauseError
	switch {
	case errors.As(err, &pause):
		// Nothing was sent: come back when told to.
		t := time.NewTimer(pause.RetryAfter)
		defer t.Stop()
		select {
		case <-t.C:
			return false, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	case err != nil:
		return false, err
	}
	return accepted(resp.Response), nil
}

func (q *quota) close() { q.db.Close() }
