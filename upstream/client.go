// Package upstream is the HTTP layer both transports share: it resolves a
// caller's path below a key's base URL (and nowhere else), has the pacer
// admit every attempt, injects the key's credential on the way out, sends
// through go-retryablehttp (whose retry decisions delegate to the pacer),
// reads each answer's rate-limit signals, and records the attempt and
// what the upstream said.
package upstream

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// Errors of the upstream side; check them with errors.Is.
var (
	// ErrMethod reports a method the key does not allow.
	ErrMethod = errors.New("method not allowed")
	// ErrUnreachable reports an upstream that could not be reached.
	ErrUnreachable = errors.New("upstream unreachable")
)

// PaceGrace is how long any call may be held for pacing, whatever the
// caller said it would wait: spacing calls a few hundred milliseconds apart
// is pacing, not a reason to answer "pause".
const PaceGrace = time.Second

// MaxRetries is how many times a call is retried after a refusal or a
// failure, when the pacer's wait fits in what the caller will wait.
const MaxRetries = 3

// A Client sends calls for every configured key. Create it with New. It
// is safe for concurrent use.
type Client struct {
	pacer *pacer.Pacer
	log   *slog.Logger

	// Clock is the time it reads; nil means real time.
	Clock clock.Clock
	// Transport, when set, carries every attempt instead of the guarded
	// transports (tests that fake the upstream).
	Transport http.RoundTripper
	// Observe, when set, is told of every step of every call (see Event):
	// the one seam metrics and the dashboard watch calls through. It is
	// called on the call's goroutine and must not block; nil means none.
	Observe func(Event)
	// Watch, when set, is told of the same steps as Observe, with the
	// context of the call they belong to (tracing hangs its spans off
	// it). Same rules as Observe; nil means none.
	Watch func(context.Context, Event)
	// Bodies bounds the memory that bodies in flight take across every
	// call; New sets DefaultBodyMemory. Set it before the first call.
	Bodies *BodyMemory

	mu         sync.Mutex
	transports map[bool]http.RoundTripper // by whether the keys may reach internal addresses
}

// New returns a Client whose calls p admits. log may be nil.
func New(p *pacer.Pacer, log *slog.Logger) *Client {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Client{pacer: p, log: log, transports: map[bool]http.RoundTripper{}, Bodies: NewBodyMemory(0)}
}

func (c *Client) now() time.Time {
	return clock.Or(c.Clock).Now()
}

// A Request is one call a caller wants made through a key.
type Request struct {
	Caller    string
	Transport ledger.Transport // ledger.Stdio, MCPHTTP or REST
	Method    string           // "" means GET
	Path      string           // below the key's base URL; may carry a query
	Query     url.Values
	Header    http.Header // end-to-end headers to forward; credentials and hop-by-hop fields are dropped
	// Body is the request body: a []byte (which retries can resend) or an
	// io.Reader (streamed once; such a call is never retried).
	Body          any
	ContentLength int64 // of a streamed Body; -1 when unknown
	// MaxWait is how long the caller will wait, in all, for admission; at
	// least PaceGrace is allowed.
	MaxWait  time.Duration
	Progress func(pacer.Progress)
	// AllMethods lets the call use any method; otherwise the key's
	// Methods (those open to MCP callers) apply.
	AllMethods bool
	// Digest identifies the request (see Digest) for a caller whose
	// repeats are counted (the fetch tool's loop guard); "" for none.
	Digest string
	// AnswerTimeout, when positive, bounds each attempt's whole answer:
	// its header and its whole body must arrive within this long of its
	// sending, or the attempt fails (an upstream failure), or the body's
	// reads fail, with ErrAnswerTimeout. Zero means no bound beyond the
	// transport's (which bounds only the header).
	AnswerTimeout time.Duration
	// MaxDecoded bounds a compressed answer's decoded body: its reads
	// fail with ErrAnswerTooLarge past it. Zero means DefaultMaxDecoded.
	MaxDecoded int64
	// Hold is the call's part of the Client's BodyMemory, when the caller
	// took one already (for the request's body); nil means a new one.
	// Either way the Response's Hold is it, and it is released when the
	// call fails or the Response's Body is closed.
	Hold *BodyHold
}

// A Response is the upstream's answer, with what mcp-quota learned from
// it. The caller must close Body.
type Response struct {
	*http.Response
	CallID   string
	Attempts int
	Waited   time.Duration // spent waiting for admission, over all attempts
	Reading  ratelimit.Reading
	Result   pacer.Result // the quota that holds after the answer, and the advice
	Target   string       // what was asked for, credential-free
	// Hold is the call's part of the memory bodies in flight may take:
	// grow it before holding more of the body in memory (ReadBody does).
	// Closing Body releases it.
	Hold *BodyHold

	redacted []string              // header fields the credential was removed from
	body     *keystore.ScrubReader // the scrubbed body
}

// Redactions names the parts of the answer the key's credential was
// removed from: header fields, and "the body" once a read of the body
// met it. Nil when the answer never repeated it.
func (r *Response) Redactions() []string {
	out := slices.Clone(r.redacted)
	if r.body != nil && r.body.Hit() {
		out = append(out, "the body")
	}
	return out
}

// Do sends r through key k. It returns a *pacer.PauseError when the call
// could not be admitted within r.MaxWait (nothing was sent), a
// *PathError for a path that leaves the base URL, a *RequestError (and
// ErrBadRequest) for a malformed request or a body the caller could not
// deliver, an error wrapping keystore.ErrNoCredential or ErrMethod for
// calls that cannot be made, ErrStateUnavailable when mcp-quota's state
// failed, ErrAnswerTimeout when the answer outlasted r.AnswerTimeout, and
// ErrUnreachable when no answer came.
//
// The answer's header fields, status text and body come with the key's
// credential removed in every form it can take (see keystore.Scrubber);
// Redactions says where it was. Errors never hold it either.
//
// Every call holds part of the Client's BodyMemory from before it is
// sent: a call that does not fit gets a *BodyMemoryError (ErrBodyMemory)
// and nothing is sent.
//
// The answer's body reads decoded from the content codings mcp-quota
// asked for (AcceptEncoding); an answer in another coding, or a partial
// answer to a request for the whole, is refused with ErrRefusedAnswer.
func (c *Client) Do(ctx context.Context, k *keystore.Key, r Request) (*Response, error) {
	if r.Hold == nil {
		r.Hold = c.bodies().Hold()
	}
	if err := r.Hold.Grow(initialHold); err != nil {
		r.Hold.Release()
		return nil, err
	}
	resp, err := c.do(ctx, k, r)
	if err != nil {
		r.Hold.Release()
	}
	return resp, scrubErr(k.Scrubber(), err)
}

func (c *Client) bodies() *BodyMemory {
	if c.Bodies == nil {
		return NewBodyMemory(0)
	}
	return c.Bodies
}

func (c *Client) do(ctx context.Context, k *keystore.Key, r Request) (*Response, error) {
	method, u, err := checkCall(k, r)
	if err != nil {
		return nil, err
	}
	cs := &call{client: c, key: k, req: r, method: method, id: NewCallID(), start: c.now(), target: ActivityTarget(k, u)}
	req, err := cs.newRequest(ctx, u)
	if err != nil {
		return nil, err
	}
	resp, err := c.retryClient(k, cs).Do(req)
	cs.ended(ctx)
	if err != nil {
		return nil, cs.failed(ctx, err)
	}
	return cs.response(resp), nil
}

// checkCall checks what r asks of k before anything is admitted: a
// well-formed request, a method the key allows, a credential, and a path
// below the key's base URL. It returns the method and the URL to send to.
func checkCall(k *keystore.Key, r Request) (string, *url.URL, error) {
	method := strings.ToUpper(r.Method)
	if method == "" {
		method = http.MethodGet
	}
	if err := checkRequest(method, r.Header); err != nil {
		return "", nil, err
	}
	if !r.AllMethods && !k.AllowsMethod(method) {
		return "", nil, fmt.Errorf("%w: key '%s' allows %s through MCP", ErrMethod, k.Name, strings.Join(k.Methods, ", "))
	}
	if _, err := k.Credential(); err != nil {
		return "", nil, fmt.Errorf("key '%s': %w", k.Name, err)
	}
	u, err := Resolve(k.BaseURL, r.Path, r.Query)
	if err != nil {
		return "", nil, err
	}
	return method, u, nil
}

// newRequest builds the call's request to u, its body and the header it
// goes upstream with (before the credential goes on), and notes whether
// the body can be sent again.
func (cs *call) newRequest(ctx context.Context, u *url.URL) (*retryablehttp.Request, error) {
	r := cs.req
	var body any
	var stream io.Reader
	switch b := r.Body.(type) {
	case nil:
		cs.replayable = true
	case []byte:
		body, cs.replayable = b, true
	case io.Reader:
		// Sent once, as it comes: retryablehttp would read a ReaderFunc
		// ahead to learn its length, so the stream goes on the request
		// itself, and the call is never retried.
		stream = b
	default:
		return nil, fmt.Errorf("upstream: unsupported body type %T", r.Body)
	}
	cs.digest = r.Digest
	req, err := retryablehttp.NewRequestWithContext(context.WithValue(ctx, callKey{}, cs), cs.method, u.String(), body)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	if stream != nil {
		rc, ok := stream.(io.ReadCloser)
		if !ok {
			rc = io.NopCloser(stream)
		}
		cs.body = &callerBody{r: rc}
		req.Body, req.ContentLength = cs.body, r.ContentLength
	}
	for name, vs := range SentHeader(cs.key, r.Header) {
		req.Header[name] = vs
	}
	return req, nil
}

// retryClient returns the retry loop one call through k runs in: its
// attempts go through the pacer (attempts), and cs decides each retry.
func (c *Client) retryClient(k *keystore.Key, cs *call) *retryablehttp.Client {
	return &retryablehttp.Client{
		HTTPClient: &http.Client{Transport: &attempts{client: c}, CheckRedirect: redirectPolicy(k)},
		RetryMax:   MaxRetries,
		CheckRetry: cs.checkRetry,
		// The pacer waits at admission (gates hold until Retry-After or the
		// backoff end), so the retry loop itself never sleeps.
		Backoff:      func(time.Duration, time.Duration, int, *http.Response) time.Duration { return 0 },
		ErrorHandler: func(resp *http.Response, err error, _ int) (*http.Response, error) { return resp, err },
		Logger:       retryLog{c.log, k.Scrubber()},
	}
}

// failed returns the error the caller gets for a call whose retry loop
// ended in err: the pacer's, the caller's or the key's own error as it
// came, and anything else as ErrUnreachable.
func (cs *call) failed(ctx context.Context, err error) error {
	k := cs.key
	var pe *pacer.PauseError
	var reqErr *RequestError
	var pathErr *PathError
	switch {
	case errors.As(err, &pe) && cs.last != nil:
		// A retry was refused after an attempt went out: that attempt's
		// answer was spent on the retry loop, so say what it was.
		what := fmt.Sprintf("HTTP %d", cs.last.status)
		if cs.lastErr != nil {
			what = unwrapURL(cs.lastErr).Error()
		}
		return fmt.Errorf("%w: key '%s': the last attempt got %s and a retry was not admitted in time (%s)",
			ErrUnreachable, k.Name, what, pe.Reason)
	case errors.As(err, &pe):
		return pe
	case errors.As(err, &pathErr):
		return pathErr
	case errors.As(err, &reqErr):
		return reqErr
	case errors.Is(err, ErrStateUnavailable):
		return fmt.Errorf("key '%s': %w", k.Name, err)
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, ErrAnswerTimeout):
		return fmt.Errorf("key '%s': %w", k.Name, unwrapURL(err))
	case errors.Is(err, ErrForbiddenAddress), errors.Is(err, ErrRefusedAnswer):
		return fmt.Errorf("key '%s': %w", k.Name, unwrapURL(err))
	}
	return fmt.Errorf("%w: key '%s': %w", ErrUnreachable, k.Name, unwrapURL(err))
}

// response wraps the upstream's answer for the caller: the key's
// credential scrubbed from its header, status line and body, the body's
// memory released when it is closed, and what the last attempt learned.
func (cs *call) response(resp *http.Response) *Response {
	out := &Response{Response: resp, CallID: cs.id, Attempts: cs.attempts, Waited: cs.waited, Target: cs.target, Hold: cs.req.Hold}
	s := cs.key.Scrubber()
	out.redacted = scrubHeader(s, resp.Header)
	if st, hit := s.Scrub(resp.Status); hit {
		resp.Status = st
		out.redacted = append(out.redacted, "the status line")
	}
	out.body = s.Reader(resp.Body)
	resp.Body = readCloser{out.body, releasing{resp.Body, cs.req.Hold}}
	if cs.last != nil {
		out.Reading, out.Result = cs.last.reading, cs.last.result
		out.Result.Warnings = cs.warnings // every attempt's
	}
	return out
}

// call is the state of one call across its attempts. Its attempts run
// one after another, so it needs no lock.
type call struct {
	client     *Client
	key        *keystore.Key
	req        Request
	method     string
	id         string
	target     string
	digest     string
	start      time.Time
	replayable bool
	attempts   int
	waited     time.Duration
	last       *answer
	lastErr    error           // the last attempt's transport error, if it had one
	lastState  string          // the state the last recorded attempt ended in
	warnings   []reason.Reason // raised by any attempt
	body       *callerBody     // a streamed body; nil otherwise
}

// answer is what one attempt brought back.
type answer struct {
	status  int
	reading ratelimit.Reading
	result  pacer.Result
}

type callKey struct{}

// checkRetry is the retry policy: retry a refusal or a failure only when
// the call can be resent (idempotent method, replayable body), the
// upstream did not say not to, and the pacer's wait still fits in what the
// caller will wait. Everything else goes back to the caller as it came.
func (cs *call) checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if err != nil {
		var pe *pacer.PauseError
		if errors.As(err, &pe) || errors.Is(err, ErrForbiddenAddress) || errors.As(err, new(*PathError)) ||
			errors.Is(err, ErrBadRequest) || errors.Is(err, ErrStateUnavailable) || errors.Is(err, ErrRefusedAnswer) {
			return false, err
		}
	}
	if !cs.replayable || !idempotent(cs.method) || cs.last == nil {
		return false, err
	}
	a := cs.last
	trouble := err != nil || a.reading.Throttled || a.status == http.StatusTooManyRequests ||
		a.status == http.StatusBadGateway || a.status == http.StatusServiceUnavailable || a.status == http.StatusGatewayTimeout
	if !trouble || a.result.DoNotRetry {
		return false, err
	}
	wait := a.result.RetryIn
	if a.result.Advice.Action == pacer.Pause {
		wait = max(wait, a.result.Advice.RetryAfter)
	}
	if cs.client.now().Sub(cs.start)+wait > max(cs.req.MaxWait, PaceGrace) {
		return false, err // the caller gets this answer, with the advice to pause
	}
	return true, nil
}

func idempotent(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// redirectPolicy follows redirects only to hosts the key may reach over
// http or https — to the key's own host only over the base URL's scheme —
// never from https to http, at most 5 times, and never to another host
// with a URL that holds the credential; any other redirect is returned to
// the caller as it came, before anything is dialled, and no credential
// leaves. No Referer follows a redirect: the URL it would name may hold
// the credential.
func redirectPolicy(k *keystore.Key) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		u := req.URL
		own := strings.EqualFold(u.Host, k.BaseURL.Host)
		switch {
		case len(via) >= 5, !k.AllowsHost(u.Host),
			u.Scheme != "http" && u.Scheme != "https",
			own && u.Scheme != k.BaseURL.Scheme,
			via[0].URL.Scheme == "https" && u.Scheme != "https",
			!own && k.Scrubber().Contains(u.String()):
			return http.ErrUseLastResponse
		}
		req.Header.Del("Referer")
		return nil
	}
}

// hopByHop are the fields a proxy never forwards (RFC 9110 §7.6.1), and
// the ones mcp-quota keeps to itself.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
	"TE", "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
	"Authorization", "Cookie", "Prefer", "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// SentHeader returns the fields a request whose caller sent h goes
// upstream with through k (before the credential goes on): the
// end-to-end fields of h, without those mcp-quota sets itself and, for a
// key with a credential, without the fields that pick a range of the
// representation; with mcp-quota's own Accept-Encoding.
func SentHeader(k *keystore.Key, h http.Header) http.Header {
	out := http.Header{}
	copyEndToEnd(out, h, k)
	out.Set("Accept-Encoding", AcceptEncoding)
	return out
}

// copyEndToEnd copies the end-to-end fields of src into dst: no hop-by-hop
// field, none named by Connection, no credential of the caller's, none
// mcp-quota sets itself, and no range field for a key with a credential.
func copyEndToEnd(dst, src http.Header, k *keystore.Key) {
	ranged := Ranged(k)
	var authName string
	if k.Auth.Kind == keystore.AuthHeader {
		authName = http.CanonicalHeaderKey(k.Auth.Name)
	}
	connection := src.Values("Connection")
	for name, vs := range src {
		c := http.CanonicalHeaderKey(name)
		if neverSent[c] || !ranged && rangeSent[c] || c == authName || listedIn(connection, c) {
			continue
		}
		for _, v := range vs {
			dst.Add(name, v)
		}
	}
}

// neverSent holds the canonical names of hopByHop and ownFields, and
// rangeSent those of rangeFields: what copyEndToEnd drops, looked up
// without building a set per call.
var neverSent, rangeSent = canonicalSet(hopByHop, ownFields), canonicalSet(rangeFields)

func canonicalSet(lists ...[]string) map[string]bool {
	set := map[string]bool{}
	for _, l := range lists {
		for _, name := range l {
			set[http.CanonicalHeaderKey(name)] = true
		}
	}
	return set
}

// listedIn reports whether the Connection field values list the field
// whose canonical name is name.
func listedIn(values []string, name string) bool {
	for _, v := range values {
		for f := range strings.SplitSeq(v, ",") {
			if http.CanonicalHeaderKey(strings.TrimSpace(f)) == name {
				return true
			}
		}
	}
	return false
}

// Digest identifies a request (method, target and a []byte body) for the
// loop guard; with an empty method and target it identifies a body.
func Digest(method, target string, body any) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s %s\n", method, target)
	if b, ok := body.([]byte); ok {
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// NewCallID returns a new random call ID for the activity.
func NewCallID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// unwrapURL drops net/http's *url.Error wrapping, whose text repeats the
// method and URL.
func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// retryLog hands go-retryablehttp's log lines to the debug level: it
// reports a pause or a refused address as a failed request, and mcp-quota
// reports what matters itself. Its values (URLs, errors naming a
// redirect's URL) go through the key's Scrubber.
type retryLog struct {
	log   *slog.Logger
	scrub *keystore.Scrubber
}

func (l retryLog) line(msg string, kv []any) {
	if !l.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	out := make([]any, len(kv))
	for i, v := range kv {
		s, _ := l.scrub.Scrub(fmt.Sprint(v))
		out[i], _ = boundText(s)
	}
	l.log.Debug(msg, out...)
}

func (l retryLog) Error(msg string, kv ...any) { l.line(msg, kv) }
func (l retryLog) Info(msg string, kv ...any)  { l.line(msg, kv) }
func (l retryLog) Debug(msg string, kv ...any) { l.line(msg, kv) }
func (l retryLog) Warn(msg string, kv ...any)  { l.line(msg, kv) }
