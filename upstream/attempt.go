package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// peekLimit is how much of an answer's body is read for signals (problem
// details, GraphQL throttling); the rest streams on untouched.
const peekLimit = 64 << 10

// attempts is the RoundTripper every attempt of a call goes through: the
// pacer admits it, the credential goes on, the signals come off, and the
// attempt is recorded. Retries and redirects pass through it again, so each
// is admitted and counted on its own.
type attempts struct {
	client *Client
}

// RoundTrip sends one attempt of the call req belongs to: admitted by the
// pacer, sent with the key's credential, its answer decoded and read for
// signals, and recorded before the caller sees it.
func (a *attempts) RoundTrip(req *http.Request) (*http.Response, error) {
	cs, _ := req.Context().Value(callKey{}).(*call)
	if cs == nil {
		closeBody(req)
		return nil, errors.New("upstream: request without a call")
	}
	c, k := a.client, cs.key
	t, target, out, err := a.admit(req, cs)
	if err != nil {
		return nil, err
	}
	actx, cancel := withAnswerDeadline(out.Context(), cs.req.AnswerTimeout)
	out = out.WithContext(actx)
	sentAt := c.now()
	cs.req.Hold.markSent()
	resp, err := a.transport(k).RoundTrip(out)
	if err != nil {
		cancel()
		return nil, a.failed(req, cs, t, target, sentAt, context.Cause(actx), err)
	}
	resp.Body = &answerBody{body: resp.Body, ctx: actx, cancel: cancel}
	cs.lastErr = nil
	answeredAt := c.now()
	// Codings are undone before anything reads the body (the signals
	// below, the scrubber, the caller); an answer that cannot be read is
	// recorded for what the upstream said, then refused.
	refused := decodeAnswer(resp, out.Method, Ranged(k), cs.req.MaxDecoded)
	// Signals are read from the answer as callers will see it: what they
	// record (policy names, partitions, problem details) never holds the
	// credential either. (The header itself stays as it came until Do
	// returns: the redirect policy reads its Location.)
	reading := ratelimit.Read(k.Profile, signals(k, resp, refused == nil), answeredAt)
	if err := c.done(req.Context(), cs, t, pacer.Outcome{SentAt: sentAt, AnsweredAt: answeredAt, Status: resp.StatusCode, Reading: &reading}, &reading, target); err != nil {
		// mcp-quota answers nothing it could not record: the budget
		// every other caller shares would not know of it.
		resp.Body.Close()
		return nil, fmt.Errorf("%w: %w: the upstream answered %d, but the call could not be recorded, so its answer is not passed on (the call may have taken effect upstream): %w",
			ErrStateUnavailable, ErrSentUnrecorded, resp.StatusCode, err)
	}
	if refused != nil {
		resp.Body.Close()
		c.log.Warn("an upstream answer was refused", "key", k.Name, "status", resp.StatusCode, "error", scrubErr(k.Scrubber(), refused))
		return nil, scrubErr(k.Scrubber(), refused)
	}
	return resp, nil
}

// failed records an attempt that got no answer (err; cause is why its
// context ended, if it did), and returns the error its caller gets.
func (a *attempts) failed(req *http.Request, cs *call, t pacer.Ticket, target string, sentAt time.Time, cause, err error) error {
	c, k := a.client, cs.key
	if errors.Is(cause, ErrAnswerTimeout) && req.Context().Err() == nil {
		err = fmt.Errorf("%w: no answer came within %s", ErrAnswerTimeout, cs.req.AnswerTimeout)
	}
	// The caller's body being too large or going bad, or the caller
	// going away, is not the upstream's failure: it must not make the
	// key back off. (mcp-quota's own bound on the answer's time is.)
	gone := req.Context().Err() != nil
	bodyErr := cs.body.err()
	abort := errors.As(err, new(*http.MaxBytesError)) || gone || bodyErr != nil
	if bodyErr != nil && !errors.As(err, new(*http.MaxBytesError)) {
		err = &RequestError{Field: "body", Reason: "the request body could not be read to its end: " + bodyErr.Error()}
	}
	err = scrubErr(k.Scrubber(), err)
	if derr := c.done(req.Context(), cs, t, pacer.Outcome{SentAt: sentAt, Err: err, CallerAbort: abort}, nil, target); derr != nil {
		return fmt.Errorf("%w: %w: the attempt failed (%w) and could not be recorded: %w", ErrStateUnavailable, ErrSentUnrecorded, err, derr)
	}
	cs.lastErr = err
	return err
}

// signals is the answer as the rate-limit reading sees it: its status,
// its header with the credential scrubbed, and, when readBody and the
// key's profile reads bodies (problem details, GraphQL throttling), the
// first peekLimit bytes of its body, scrubbed; resp's body still streams
// whole to the caller.
func signals(k *keystore.Key, resp *http.Response, readBody bool) ratelimit.Response {
	rr := ratelimit.Response{Status: resp.StatusCode, Header: resp.Header}
	if s := k.Scrubber(); s != nil && holdsSecret(s, resp.Header) {
		rr.Header = resp.Header.Clone()
		scrubHeader(s, rr.Header)
	}
	if !readBody || !wantsBody(resp, k.Profile) {
		return rr
	}
	prefix, err := io.ReadAll(io.LimitReader(resp.Body, peekLimit))
	if err == nil || len(prefix) > 0 {
		seen := prefix
		if len(prefix) == peekLimit {
			// Cut from a longer body: a tail that could begin the
			// credential is not read for signals.
			seen = k.Scrubber().CutTail(prefix)
		}
		rr.Body, _ = k.Scrubber().ScrubBytes(seen)
		resp.Body = readCloser{io.MultiReader(bytes.NewReader(prefix), resp.Body), resp.Body}
	}
	return rr
}

// admit has the pacer admit the next attempt of cs's call, and returns
// its ticket, its target as the activity shows it, and the request to
// send, with the key's credential on it. An attempt that
// would leave later than its margin allows (a busy machine delayed it
// since its admission) is not sent: it ends as such, and the call is
// admitted again, counted in the window it will land in.
func (a *attempts) admit(req *http.Request, cs *call) (pacer.Ticket, string, *http.Request, error) {
	c, k := a.client, cs.key
	var late *pacer.LateError // the attempt this one replaces, if any
	for {
		cs.attempts++
		admitStart := c.now()
		target := ActivityTarget(k, req.URL)
		remaining := max(cs.req.MaxWait, PaceGrace) - admitStart.Sub(cs.start)
		// What the request carries, as known before it is sent (a body of
		// unknown length counts none), spends budgets in content-bytes.
		t, err := c.pacer.Admit(req.Context(), pacer.Call{Key: k, Caller: cs.req.Caller, Transport: cs.req.Transport,
			Method: cs.method, Target: target, Digest: cs.digest, CallID: cs.id, Attempt: cs.attempts, Bytes: max(req.ContentLength, 0),
			MaxWait: max(remaining, 0), Progress: cs.req.Progress, Late: late})
		if err != nil {
			closeBody(req)
			var pe *pacer.PauseError
			if errors.As(err, &pe) { // recorded in the activity
				cs.lastState = string(ledger.RejectedLocal)
				c.observe(req.Context(), Event{Kind: Refused, Key: k.Name, Caller: cs.req.Caller, Transport: cs.req.Transport,
					CallID: cs.id, Attempt: cs.attempts, State: string(ledger.RejectedLocal), Source: pe.Source, Gate: pe.Gate, Limit: pe.Limit,
					Wait: c.now().Sub(admitStart), Method: cs.method, Target: target})
			} else if req.Context().Err() == nil {
				// Not a refusal and not the caller leaving: the state file
				// failed, and nothing was sent.
				err = fmt.Errorf("%w: %w", ErrStateUnavailable, err)
			}
			return t, target, nil, err
		}
		cs.waited += t.Waited
		out := req.Clone(req.Context())
		if err := authorize(out, k); err != nil {
			closeBody(req)
			c.done(req.Context(), cs, t, pacer.Outcome{SentAt: c.now(), Err: err}, nil, target) // nothing went out
			return t, target, nil, err
		}
		if err := c.pacer.Leaving(t); !errors.As(err, &late) {
			return t, target, out, nil
		}
		// Nothing went out: the call's last answer is still the one
		// before, if any.
		last, lastErr := cs.last, cs.lastErr
		if err := c.done(req.Context(), cs, t, pacer.Outcome{Err: late, CallerAbort: true}, nil, target); err != nil {
			closeBody(req)
			return t, target, nil, fmt.Errorf("%w: %w", ErrStateUnavailable, err) // nothing was sent
		}
		cs.last, cs.lastErr = last, lastErr
	}
}

// done records an attempt's outcome, and returns the error when it could
// not be recorded (which is also logged).
func (c *Client) done(ctx context.Context, cs *call, t pacer.Ticket, o pacer.Outcome, rd *ratelimit.Reading, target string) error {
	// Recorded even when the caller has gone: the attempt happened.
	res, err := c.pacer.Done(context.WithoutCancel(ctx), t, o)
	if err != nil && !o.SentAt.IsZero() && !t.Leased() && errors.Is(err, ledger.ErrUnavailable) {
		// The call went upstream: its outcome is worth one more bounded
		// try, unless the failed one committed after all.
		if recorded, rerr := c.pacer.Recorded(context.WithoutCancel(ctx), t); rerr == nil {
			if recorded {
				err = nil
			} else {
				res, err = c.pacer.Done(context.WithoutCancel(ctx), t, o)
			}
		}
	}
	if err != nil {
		c.log.Error("recording an attempt failed", "key", cs.key.Name, "call", cs.id, "error", err)
	}
	s := cs.key.Scrubber()
	scrub := func(t string) string { t, _ = s.Scrub(t); return t }
	res.Advice.Why = res.Advice.Why.Map(scrub)
	for i, w := range res.Warnings {
		res.Warnings[i] = w.Map(scrub)
	}
	cs.lastState = string(res.State)
	e := Event{Kind: Attempted, Key: cs.key.Name, Caller: cs.req.Caller, Transport: cs.req.Transport, CallID: cs.id,
		Attempt: cs.attempts, State: string(res.State), Status: o.Status, Wait: t.Waited, HeldBy: t.HeldBy,
		Method: cs.method, Target: target, Reading: rd}
	if !o.SentAt.IsZero() {
		end := o.AnsweredAt
		if end.IsZero() {
			end = c.now()
		}
		e.Latency = end.Sub(o.SentAt)
	}
	c.observe(ctx, e)
	a := &answer{status: o.Status, result: res}
	if rd != nil {
		a.reading = *rd
	}
	cs.last = a
	cs.warnings = append(cs.warnings, res.Warnings...)
	for _, w := range res.Warnings {
		c.log.Warn(w.String(), "key", cs.key.Name)
	}
	return err
}

func (a *attempts) transport(k *keystore.Key) http.RoundTripper {
	c := a.client
	if c.Transport != nil {
		return c.Transport
	}
	// Keys share connections: one transport for the keys that may reach
	// internal addresses and one for the rest (the guard is the dialer's),
	// each pooling per host, so 1,000 keys on one API keep a few
	// connections, not 1,000.
	internal := allowsInternal(k.BaseURL)
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.transports[internal]
	if !ok {
		t = newTransport(k.BaseURL)
		c.transports[internal] = t
	}
	return t
}

// authorize puts k's credential on req — only when req goes to the key's
// own host over the key's own scheme. Any credential the caller sent was
// dropped earlier.
func authorize(req *http.Request, k *keystore.Key) error {
	if k.Auth.Kind == keystore.AuthNone || req.URL.Host != k.BaseURL.Host || req.URL.Scheme != k.BaseURL.Scheme {
		return nil
	}
	s, err := k.Credential()
	if err != nil {
		return err
	}
	switch k.Auth.Kind {
	case keystore.AuthBearer:
		req.Header.Set("Authorization", "Bearer "+s.Reveal())
	case keystore.AuthHeader:
		req.Header.Set(k.Auth.Name, s.Reveal())
	case keystore.AuthQuery:
		u := *req.URL
		q := u.Query()
		q.Set(k.Auth.Name, s.Reveal())
		u.RawQuery = q.Encode()
		req.URL = &u
	}
	return nil
}

// wantsBody reports whether signals may hide in the body: problem details
// and error bodies on refusals, GraphQL throttling on 200s for the
// profiles that read it.
func wantsBody(resp *http.Response, p ratelimit.Profile) bool {
	if resp.StatusCode >= 400 {
		return true
	}
	if !p.ReadsSuccessBody() {
		return false
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return mt == "application/json" || mt == "application/graphql-response+json"
}

type readCloser struct {
	io.Reader
	io.Closer
}

// releasing closes a body, then releases its call's hold on the body
// memory.
type releasing struct {
	io.Closer
	hold *BodyHold
}

func (r releasing) Close() error {
	err := r.Closer.Close()
	r.hold.Release()
	return err
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// ended reports the end of the call to the Observe hook.
func (cs *call) ended(ctx context.Context) {
	st := cs.lastState
	if st == "" {
		st = Canceled
	}
	cs.client.observe(ctx, Event{Kind: Ended, Key: cs.key.Name, Caller: cs.req.Caller, Transport: cs.req.Transport,
		CallID: cs.id, Attempt: cs.attempts, State: st, Status: cs.status()})
}

func (cs *call) status() int {
	if cs.last == nil {
		return 0
	}
	return cs.last.status
}
