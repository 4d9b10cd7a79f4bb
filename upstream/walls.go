package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
)

// ErrBadRequest reports a request mcp-quota refused because the caller
// wrote it wrong (a header value with a line break, a body that could not
// be read): nothing was sent, or what was sent failed on the caller's
// side, and the key's backoff and circuit breaker did not count it.
var ErrBadRequest = errors.New("bad request")

// ErrAnswerTimeout reports an upstream whose whole answer — header and
// body — did not arrive within the request's AnswerTimeout.
var ErrAnswerTimeout = errors.New("the upstream's answer took too long")

// ErrStateUnavailable reports a call that could not be admitted or
// recorded because mcp-quota's own state failed (a file's disk full, an
// I/O error, a corrupt page; a database that does not answer). Nothing
// was sent, unless ErrSentUnrecorded says otherwise.
var ErrStateUnavailable = errors.New("state unavailable")

// ErrSentUnrecorded reports a call that went to the upstream — it may
// have taken effect there — whose outcome mcp-quota could not record, so
// its answer is not passed on. errors.Is(err, ErrStateUnavailable) is
// true for it too; the budget counted it when it was admitted.
var ErrSentUnrecorded = errors.New("the call went upstream, but its outcome could not be recorded")

// A RequestError is a malformed request, refused before any attempt.
// errors.Is(err, ErrBadRequest) is true for it.
type RequestError struct {
	Field  string // the header field or argument at fault
	Reason string
}

func (e *RequestError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Reason) }

// Is makes errors.Is(err, ErrBadRequest) true for a *RequestError.
func (e *RequestError) Is(target error) bool { return target == ErrBadRequest }

// checkRequest refuses what net/http would refuse only when sending — a
// method or header field name that is not a token (RFC 9110 §5.1), a
// field value holding a control character other than HTAB (CR and LF
// would split the field) — so that a malformed request costs the key
// nothing.
func checkRequest(method string, h http.Header) error {
	if !token(method) {
		return &RequestError{Field: "method", Reason: fmt.Sprintf("%q is not a valid HTTP method", method)}
	}
	for name, vs := range h {
		if !token(name) {
			return &RequestError{Field: fmt.Sprintf("header %q", name), Reason: "a header name may hold only letters, digits and !#$%&'*+-.^_`|~"}
		}
		for _, v := range vs {
			for i := 0; i < len(v); i++ {
				if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
					return &RequestError{Field: "header " + name,
						Reason: "its value holds a control character (a line break or NUL); send one value per header, without line breaks"}
				}
			}
		}
	}
	return nil
}

// token reports whether s is an RFC 9110 token: 1*tchar.
func token(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// callerBody is a streamed request body that remembers failing: a body
// the caller could not deliver (a chunked body that goes bad, a client
// that hangs up) fails the attempt on the caller's side.
type callerBody struct {
	r      io.ReadCloser
	failed atomic.Pointer[error]
}

func (b *callerBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		b.failed.CompareAndSwap(nil, &err)
	}
	return n, err
}

func (b *callerBody) Close() error { return b.r.Close() }

// err returns the error reading the body failed with, or nil.
func (b *callerBody) err() error {
	if b == nil {
		return nil
	}
	if e := b.failed.Load(); e != nil {
		return *e
	}
	return nil
}

// scrubbed is an error whose text went through the key's Scrubber; it
// unwraps to the error it stands for.
type scrubbed struct {
	err error
	msg string
}

func (e *scrubbed) Error() string { return e.msg }
func (e *scrubbed) Unwrap() error { return e.err }

// maxErrorText bounds the text of an error an upstream's answer caused:
// Go's client quotes a malformed header line whole in its error, up to
// the 1 MiB it reads of a header, and that text would reach the caller,
// the log and every attempt's reason in the activity.
const maxErrorText = 1000

// scrubErr returns err with the credential removed from its text, and the
// text cut to maxErrorText bytes.
func scrubErr(s *keystore.Scrubber, err error) error {
	if err == nil {
		return err
	}
	msg := err.Error()
	changed := false
	if scrubbedMsg, hit := s.Scrub(msg); hit {
		msg, changed = scrubbedMsg, true
	}
	if cut, ok := boundText(msg); ok {
		msg, changed = cut, true
	}
	if changed {
		return &scrubbed{err: err, msg: msg}
	}
	return err
}

// boundText cuts an error's text, scrubbed already (so that no form of
// the credential is cut short), to maxErrorText bytes, and says whether
// it did. Invalid bytes become U+FFFD, never nothing (see render in
// tools), so that what they split stays split.
func boundText(msg string) (string, bool) {
	if len(msg) <= maxErrorText {
		return msg, false
	}
	return strings.ToValidUTF8(msg[:maxErrorText], "\uFFFD") + "… (cut)", true
}

// ActivityTarget is what the activity records for a request to u: the
// target relative to the key's base URL (see Target), without the key's
// own query parameter, and with the credential removed in any form it
// has.
func ActivityTarget(k *keystore.Key, u *url.URL) string {
	if k.Auth.Kind == keystore.AuthQuery {
		if q := u.Query(); q.Has(k.Auth.Name) {
			c := *u
			q.Del(k.Auth.Name)
			c.RawQuery = q.Encode()
			u = &c
		}
	}
	t, _ := k.Scrubber().Scrub(Target(k.BaseURL, u))
	return t
}

// holdsSecret reports whether scrubHeader would change h: whether a
// field's name or one of its values holds a form of s's secret. Most
// answers hold none, and need no copy to be read from.
func holdsSecret(s *keystore.Scrubber, h http.Header) bool {
	for name, vs := range h {
		if s.ContainsFold(name) {
			return true
		}
		for _, v := range vs {
			if s.Contains(v) {
				return true
			}
		}
	}
	return false
}

// scrubHeader removes the credential from every field of h, in place:
// values are scrubbed, a field whose name holds it is dropped. It returns
// the names of the fields it changed.
func scrubHeader(s *keystore.Scrubber, h http.Header) []string {
	if s == nil {
		return nil
	}
	var changed []string
	for name, vs := range h {
		if s.ContainsFold(name) {
			delete(h, name)
			changed = append(changed, "a header field whose name held it")
			continue
		}
		hit := false
		for i, v := range vs {
			if sv, ok := s.Scrub(v); ok {
				vs[i], hit = sv, true
			}
		}
		if hit {
			changed = append(changed, name)
		}
	}
	slices.Sort(changed)
	return slices.Compact(changed)
}

// RedactionWarning is the warning a result carries when mcp-quota
// removed the key's credential from what the upstream answered.
func RedactionWarning(where []string) string {
	return fmt.Sprintf("The upstream's answer repeated the key's credential (in %s); mcp-quota replaced it with %s, so those parts are not exactly what the upstream sent.",
		strings.Join(where, ", "), keystore.Redacted)
}

// answerBody is an attempt's body, whose reads fail with
// ErrAnswerTimeout once the attempt's deadline passed; closing it
// releases the attempt's context.
type answerBody struct {
	body   io.ReadCloser
	ctx    context.Context
	cancel context.CancelFunc
}

func (b *answerBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && errors.Is(context.Cause(b.ctx), ErrAnswerTimeout) {
		err = fmt.Errorf("%w: the body was still arriving when the time ran out: %w", ErrAnswerTimeout, err)
	}
	return n, err
}

func (b *answerBody) Close() error {
	err := b.body.Close()
	b.cancel()
	return err
}

// withAnswerDeadline returns ctx bounded to d from now (when d > 0), whose
// cause on expiry is ErrAnswerTimeout.
func withAnswerDeadline(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeoutCause(ctx, d, fmt.Errorf("%w (%s)", ErrAnswerTimeout, d))
}
