package rest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// methods are the methods the REST side forwards. TRACE would have the
// upstream echo the request — the key's credential included — back to
// the caller; CONNECT is not a request for a resource.
var methods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodOptions}

// Forward serves /k/{key}/{path...}: it forwards the request's method,
// path, query, end-to-end header fields and body to the key's upstream,
// with the key's credential, and answers with the upstream's answer —
// its URI references pointed back at /k/{key}/, and the rate-limit
// fields describing the shared budget. The path is taken as the caller
// escaped it, so "..", "//" and their encodings reach upstream.Resolve,
// which refuses them.
func (h *Handler) Forward(w http.ResponseWriter, r *http.Request) {
	lim := h.Limits.withDefaults()
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), "/k/")
	if !ok {
		writeProblem(w, http.StatusBadRequest, CodeBadRequest, "REST paths look like /k/{key}/{path below the key's base URL}.", nil)
		return
	}
	name, path, _ := strings.Cut(rest, "/")
	k, caller, ok := h.key(w, r, name)
	if !ok || !h.forwardable(w, r, k, caller, lim) {
		return
	}
	wait, applied := preferWait(r.Header, lim)
	if r.URL.RawQuery != "" || r.URL.ForceQuery {
		path += "?" + r.URL.RawQuery
	}
	req := upstream.Request{Caller: caller.Name, Transport: ledger.REST, Method: r.Method, Path: "/" + path,
		Header: r.Header, MaxWait: wait, AllMethods: true, MaxDecoded: lim.MaxBody, Hold: h.Client.BodyHold()}
	defer req.Hold.Release() // whatever the call held of the body memory, however it ends
	body := &limitedBody{r: http.MaxBytesReader(w, r.Body, lim.MaxBody)}
	if !h.attachBody(w, r, k, caller, &req, body, lim) {
		return
	}
	resp, err := h.Client.Do(r.Context(), k, req)
	if err != nil {
		if tooLarge := body.tooLarge(); tooLarge != nil {
			err = tooLarge
		}
		h.failed(w, r, k, caller, err)
		return
	}
	defer resp.Body.Close()
	// The answer's fields and body come scrubbed of the credential (see
	// upstream.Client.Do); a body that fits the lookahead is read whole,
	// so that its length is the one sent, and a broken one is named.
	ans, err := lookahead(resp, r.Method)
	if err != nil {
		h.failed(w, r, k, caller, err)
		return
	}
	hdr := w.Header()
	h.answerHeader(hdr, k, resp)
	if applied != "" {
		hdr.Set("Preference-Applied", applied)
	}
	ans.header(hdr, resp, r.Method)
	w.WriteHeader(resp.StatusCode)
	if r.Method == http.MethodHead {
		return
	}
	if err := ans.send(w, resp, flushEach(resp.Response)); err != nil {
		h.log().Info("streaming an answer ended early", "key", k.Name, "error", err)
		// The caller must not take a cut body for a whole one: end the
		// exchange without its final chunk.
		panic(http.ErrAbortHandler)
	}
}

// forwardable reports whether r is a call mcp-quota forwards: a method
// it forwards, with a body no longer than the limit; otherwise it answers
// the problem, with the key's quota fields.
func (h *Handler) forwardable(w http.ResponseWriter, r *http.Request, k *keystore.Key, caller *keystore.Caller, lim Limits) bool {
	if !slices.Contains(methods, r.Method) {
		h.quotaHeaders(w, r, k, caller)
		w.Header().Set("Allow", strings.Join(methods, ", "))
		writeProblem(w, http.StatusMethodNotAllowed, CodeBadRequest,
			fmt.Sprintf("mcp-quota does not forward %s; it forwards %s.", r.Method, strings.Join(methods, ", ")), nil)
		return false
	}
	if r.ContentLength > lim.MaxBody {
		h.quotaHeaders(w, r, k, caller)
		writeProblem(w, http.StatusRequestEntityTooLarge, CodePayloadTooLarge,
			fmt.Sprintf("The request body is %d bytes; the most mcp-quota forwards is %d.", r.ContentLength, lim.MaxBody), nil)
		return false
	}
	return true
}

// attachBody gives req the caller's body: none, streamed once when it is
// longer than the replayable limit, or read into memory so that retries
// can resend it. It reports false when it answered a problem instead.
func (h *Handler) attachBody(w http.ResponseWriter, r *http.Request, k *keystore.Key, caller *keystore.Caller,
	req *upstream.Request, body *limitedBody, lim Limits) bool {
	switch {
	case r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0:
		return true
	case r.ContentLength > lim.ReplayableBody:
		req.Body, req.ContentLength = body, r.ContentLength // streamed once; never retried
		return true
	}
	// Buffer what fits the replayable limit, so that retries can resend
	// it; a body of unknown length that turns out longer streams on from
	// what was read.
	b, err := upstream.ReadBody(body, lim.ReplayableBody, req.Hold)
	if errors.Is(err, upstream.ErrBodyMemory) {
		h.failed(w, r, k, caller, err)
		return false
	}
	if err != nil {
		h.quotaHeaders(w, r, k, caller)
		h.bodyError(w, err)
		return false
	}
	if int64(len(b)) <= lim.ReplayableBody {
		req.Body, req.ContentLength = b, int64(len(b))
	} else {
		req.Body, req.ContentLength = io.MultiReader(bytes.NewReader(b), body), -1
	}
	return true
}

// answerHeader sets the fields of the upstream's answer the caller gets:
// the upstream's own, with references rewritten to the key's path, and
// the budget and wait as mcp-quota states them.
func (h *Handler) answerHeader(hdr http.Header, k *keystore.Key, resp *upstream.Response) {
	copyResponseHeaders(hdr, resp.Header)
	if !upstream.Ranged(k) {
		// Range never goes upstream for this key (see upstream.SentHeader):
		// the caller gets whole representations only.
		hdr.Set("Accept-Ranges", "none")
	}
	var from *url.URL
	if resp.Request != nil {
		from = resp.Request.URL
	}
	rewriteRefs(hdr, k, from)
	after := decidedWait(resp)
	if ls := limits(resp.Result.Budgets, after > 0); len(ls) > 0 || after > 0 {
		// else the upstream's own fields pass as they came
		ratelimit.WriteFields(hdr, ratelimit.Announcement{Profile: k.Profile, Limits: ls, Wait: wholeSeconds(after),
			Secondary: secondaryRefusal(&resp.Reading), Now: h.now()})
	}
	ratelimit.ReplaceRetryAfter(hdr, after)
}

// limitedBody is a request body under http.MaxBytesReader that remembers
// hitting the limit, however the error that ended the call was wrapped.
type limitedBody struct {
	r   io.Reader
	hit atomic.Pointer[http.MaxBytesError]
}

func (b *limitedBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		b.hit.Store(tooLarge)
	}
	return n, err
}

func (b *limitedBody) tooLarge() error {
	if e := b.hit.Load(); e != nil {
		return e
	}
	return nil
}

// quotaHeaders puts the key's budget, as caller meets it now, in the
// rate-limit fields of an answer mcp-quota gives itself. It reads the
// state file only.
func (h *Handler) quotaHeaders(w http.ResponseWriter, r *http.Request, k *keystore.Key, caller *keystore.Caller) {
	h.refusalHeaders(w, r, k, caller, 0, false)
}

// refusalHeaders is quotaHeaders for a refusal that asks the caller to
// wait (0: none): every field then says that nothing is left until
// then, in the vendor's fields of the key's profile too (secondary: the
// wait is no spent quota, and the vendor's counts stay as they are).
func (h *Handler) refusalHeaders(w http.ResponseWriter, r *http.Request, k *keystore.Key, caller *keystore.Caller, wait time.Duration, secondary bool) {
	st, err := h.Pacer.Status(r.Context(), k, caller.Name)
	if err != nil {
		h.log().Warn("reading the budget for an answer's headers failed", "key", k.Name, "error", err)
		st = pacer.KeyStatus{}
	}
	ratelimit.WriteFields(w.Header(), ratelimit.Announcement{Profile: k.Profile,
		Limits: limits(append(st.Local, st.Upstream...), wait > 0), Wait: wait, Secondary: secondary, Now: h.now()})
}

// wholeSeconds is d as Retry-After states it: whole seconds, rounded
// up, at least 1 (0 stays 0).
func wholeSeconds(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(max(math.Ceil(d.Seconds()), 1)) * time.Second
}

// Problem codes of the answers the REST side refuses to hold or pass on.
const (
	// CodeBodyMemory is a call whose body did not fit in the memory that
	// bodies in flight may take across all callers (503, Retry-After).
	CodeBodyMemory = "bodyMemory"
	// CodeAnswerRefused is an upstream answer mcp-quota did not pass on:
	// in a content coding it did not ask for, or a part of a
	// representation when it asked for the whole (502).
	CodeAnswerRefused = "answerRefused"
)

// failed answers a call that got no answer from the upstream.
func (h *Handler) failed(w http.ResponseWriter, r *http.Request, k *keystore.Key, caller *keystore.Caller, err error) {
	var pe *pacer.PauseError
	var tooLarge *http.MaxBytesError
	if r.Context().Err() != nil && !errors.As(err, &pe) {
		// The caller went away, or serve cancelled the call as it stopped
		// (its connection still open for a moment): either way no answer
		// came, and returning without one would have net/http answer an
		// empty 200 in its place. The exchange ends without an answer.
		panic(http.ErrAbortHandler)
	}
	paused := errors.As(err, &pe)
	switch {
	case errors.Is(err, upstream.ErrStateUnavailable): // its headers are read from the state that just failed
	case paused:
		// Rounded up as Retry-After is, so that no field names an
		// earlier instant than it does.
		h.refusalHeaders(w, r, k, caller, wholeSeconds(pe.RetryAfter), waitOnly(pe))
	default:
		h.quotaHeaders(w, r, k, caller)
	}
	switch {
	case paused:
		ratelimit.SetRetryAfter(w.Header(), pe.RetryAfter)
		secs := max(report.Seconds(pe.RetryAfter), 1)
		ext := map[string]any{"type": ratelimit.ProblemQuotaExceeded, "key": k.Name, "retry_after_s": secs}
		if pe.Binding != nil && !pe.Binding.Hidden {
			ext["violated-policies"] = []string{pe.Binding.Policy}
		}
		writeRefusal(w, k.Profile, refusal{status: http.StatusTooManyRequests, secondary: waitOnly(pe), binding: pe.Binding, code: refusalCode(pe),
			detail: fmt.Sprintf("Key '%s': %s. Nothing was sent upstream. Try again in %s; the RateLimit header says what is left.", k.Name, pe.Reason, reason.Duration(time.Duration(secs)*time.Second))}, ext)
	case errors.As(err, &tooLarge):
		h.bodyError(w, err)
	case errors.Is(err, upstream.ErrBodyMemory):
		h.log().Warn("a call did not fit in the memory for bodies in flight", "key", k.Name, "error", err)
		ratelimit.SetRetryAfter(w.Header(), time.Second)
		writeProblem(w, http.StatusServiceUnavailable, CodeBodyMemory, reason.Sentence(err.Error())+" Try again in a moment.", nil)
	case errors.Is(err, upstream.ErrRefusedAnswer):
		writeProblem(w, http.StatusBadGateway, CodeAnswerRefused, reason.Sentence(err.Error()), nil)
	case errors.Is(err, upstream.ErrBadPath), errors.Is(err, upstream.ErrBadRequest):
		writeProblem(w, http.StatusBadRequest, CodeBadRequest, reason.Sentence(err.Error()), nil)
	case errors.Is(err, upstream.ErrSentUnrecorded):
		h.log().Error("the state failed after a call went upstream", "key", k.Name, "error", err)
		writeProblem(w, http.StatusServiceUnavailable, CodeStateUnavailable,
			report.Unavailable(err)+": the call went upstream and may have taken effect there, but its outcome could not be recorded, "+
				"so its answer is withheld. Check before repeating a request that changes something.", nil)
	case errors.Is(err, upstream.ErrStateUnavailable):
		h.log().Error("the state failed", "key", k.Name, "error", err)
		writeProblem(w, http.StatusServiceUnavailable, CodeStateUnavailable,
			report.Unavailable(err)+", so no call can be admitted or recorded; nothing was sent upstream. Try again later; GET /healthz says when it is back.", nil)
	case errors.Is(err, upstream.ErrAnswerTimeout), errors.Is(err, errAnswerBroken):
		h.log().Info("the upstream's answer failed", "key", k.Name, "error", err)
		writeProblem(w, http.StatusBadGateway, CodeUpstreamUnavailable, reason.Sentence(err.Error()), nil)
	case errors.Is(err, keystore.ErrNoCredential):
		writeProblem(w, http.StatusServiceUnavailable, CodeUpstreamUnavailable, reason.Sentence(err.Error()), nil)
	case errors.Is(err, upstream.ErrForbiddenAddress):
		writeProblem(w, http.StatusBadGateway, CodeUpstreamUnavailable, reason.Sentence(err.Error()), nil)
	default:
		h.log().Info("no answer from the upstream", "key", k.Name, "error", err)
		detail := reason.Sentence(err.Error())
		if errors.Is(err, upstream.ErrUnreachable) && k.UnreachableHint != "" {
			detail += " " + reason.Sentence(k.UnreachableHint)
		}
		writeProblem(w, http.StatusBadGateway, CodeUpstreamUnavailable, detail, nil)
	}
}

func (h *Handler) bodyError(w http.ResponseWriter, err error) {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		writeProblem(w, http.StatusRequestEntityTooLarge, CodePayloadTooLarge,
			fmt.Sprintf("The request body is larger than %d bytes, the most mcp-quota forwards.", tooLarge.Limit), nil)
		return
	}
	writeProblem(w, http.StatusBadRequest, CodeBadRequest, "The request body could not be read.", nil)
}

// preferWait reads Prefer: wait=N (RFC 7240): how long the caller will be
// held for the budget instead of refused.
func preferWait(h http.Header, lim Limits) (time.Duration, string) {
	for _, v := range h.Values("Prefer") {
		for _, pref := range strings.Split(v, ",") {
			name, val, _ := strings.Cut(strings.TrimSpace(pref), "=")
			if !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			n, err := strconv.ParseFloat(strings.Trim(strings.TrimSpace(val), `"`), 64)
			if err != nil || n < 0 || math.IsNaN(n) {
				continue
			}
			d := lim.MaxWait
			if n < lim.MaxWait.Seconds() {
				d = time.Duration(n * float64(time.Second))
			}
			return d, "wait=" + strconv.FormatInt(report.Seconds(d), 10)
		}
	}
	return lim.DefaultWait, ""
}

// limits turns budgets into the limits the response headers announce:
// every budget whose remaining is known.
// Limits learned from refusals (Hidden) are left out: the upstream never
// announced them, and what they hold back is said by the wait. With
// refused set, budgets whose remaining is unknown are kept too (the
// refusal states them as 0 until its wait).
func limits(bs []pacer.Budget, refused bool) []ratelimit.Limit {
	var out []ratelimit.Limit
	seen := map[string]bool{}
	for _, b := range bs {
		if b.Hidden || b.Limit <= 0 || (b.Remaining < 0 && !refused) {
			continue
		}
		id := b.Policy + "\x00" + b.Partition
		l := ratelimit.Limit{Policy: b.Policy, Unit: b.Unit, Quota: b.Limit, Window: b.Window, Remaining: max(b.Remaining, 0),
			Reset: b.Reset, Partition: b.Partition}
		if seen[id] { // a policy both documented and announced: keep the tighter
			for i := range out {
				if out[i].Policy == b.Policy && out[i].Partition == b.Partition && (l.Remaining < out[i].Remaining || (l.Remaining == out[i].Remaining && l.Reset > out[i].Reset)) {
					out[i] = l
				}
			}
			continue
		}
		seen[id] = true
		out = append(out, l)
	}
	return out
}

// flushEach reports whether an answer's body should reach the caller as
// each piece arrives (a stream, or a body of unknown length, as
// httputil.ReverseProxy does); other bodies go through the server's
// buffer, which still passes them on as it fills.
func flushEach(resp *http.Response) bool {
	if resp.ContentLength < 0 {
		return true
	}
	// The media type is the field's value before any parameter, in any
	// case (what mime.ParseMediaType returns for it, without building
	// the parameters' map on every answer).
	base, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";")
	return strings.EqualFold(strings.TrimSpace(base), "text/event-stream")
}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copyBody streams src to w, flushing after every piece when flush is
// set.
func copyBody(w http.ResponseWriter, src io.Reader, flush bool) (int64, error) {
	rc := http.NewResponseController(w)
	bp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bp)
	buf := *bp
	var n int64
	for {
		m, err := src.Read(buf)
		if m > 0 {
			if _, werr := w.Write(buf[:m]); werr != nil {
				return n, fmt.Errorf("%w: %w", errCallerGone, werr)
			}
			n += int64(m)
			if flush {
				_ = rc.Flush()
			}
		}
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
