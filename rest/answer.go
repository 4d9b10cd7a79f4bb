package rest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// WarningField is the response field (and trailer, for a streamed body,
// whose redactions are known only at its end) in which the REST side says
// it changed the upstream's answer: where it removed the key's
// credential.
const WarningField = "Mcp-Quota-Warning"

// lookaheadLimit is how much of an answer's body is read before the
// answer's header goes out: a body this small is sent with its exact
// length (after scrubbing), and one that breaks is answered with a
// problem instead of a cut body. Larger bodies, and streams, are passed
// on as they arrive, without the upstream's Content-Length.
const lookaheadLimit = 256 << 10

// errAnswerBroken reports an answer whose body ended before it was whole.
var errAnswerBroken = errors.New("the upstream's answer broke off")

// errCallerGone reports a caller that stopped reading an answer (it hung
// up, or its connection broke) while it was being sent.
var errCallerGone = errors.New("the caller stopped reading the answer")

// answer is an upstream answer on its way to the caller.
type answer struct {
	head  []byte // the whole body, when whole is set
	whole bool
}

// lookahead reads the body of resp when it is small enough to be sent
// whole; it returns an error wrapping errAnswerBroken (or
// upstream.ErrAnswerTimeout) when that body ends before its end.
func lookahead(resp *upstream.Response, method string) (*answer, error) {
	a := &answer{}
	if method == http.MethodHead || !bodyAllowed(resp.StatusCode) || flushEach(resp.Response) || resp.ContentLength > lookaheadLimit {
		return a, nil
	}
	// The lookahead holds the body in memory: when the memory for bodies
	// in flight has no room, the body streams on instead.
	if resp.Hold.Grow(min(max(resp.ContentLength, 0), lookaheadLimit)+bytes.MinRead) != nil {
		return a, nil
	}
	// Read into a buffer of the announced size (scrubbing may change it
	// a little; the buffer grows then), not io.ReadAll's doublings.
	buf := bytes.NewBuffer(make([]byte, 0, min(max(resp.ContentLength, 0), lookaheadLimit)+bytes.MinRead))
	_, err := buf.ReadFrom(io.LimitReader(resp.Body, lookaheadLimit+1))
	b := buf.Bytes()
	if err != nil {
		return nil, brokenBody(err, int64(len(b)), resp.ContentLength)
	}
	if len(b) <= lookaheadLimit {
		a.head, a.whole = b, true
		return a, nil
	}
	a.head = b // longer than it said: the rest streams on
	return a, nil
}

// brokenBody names what cut a body short after n bytes of the declared
// length (-1 when none was declared).
func brokenBody(err error, n, declared int64) error {
	if errors.Is(err, upstream.ErrAnswerTimeout) {
		return err
	}
	of := ""
	if declared >= 0 {
		of = fmt.Sprintf(" of the %d it announced", declared)
	}
	return fmt.Errorf("%w after %d bytes%s: %w", errAnswerBroken, n, of, err)
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// header sets the fields the body decides: its length, when the body is
// whole (never the upstream's, which may not be true: a HEAD's passes as
// it came), and the warning.
func (a *answer) header(h http.Header, resp *upstream.Response, method string) {
	switch {
	case method == http.MethodHead:
	case a.whole && bodyAllowed(resp.StatusCode):
		h.Set("Content-Length", strconv.Itoa(len(a.head)))
	default:
		h.Del("Content-Length")
	}
	if where := resp.Redactions(); len(where) > 0 {
		h.Set(WarningField, upstream.RedactionWarning(where))
	}
}

// send writes the body to w, and, for a streamed body, the warning
// trailer when the credential was removed from it.
func (a *answer) send(w http.ResponseWriter, resp *upstream.Response, flush bool) error {
	if a.whole {
		_, err := w.Write(a.head)
		return err
	}
	before := len(resp.Redactions())
	n, err := copyBody(w, io.MultiReader(bytes.NewReader(a.head), resp.Body), flush)
	if where := resp.Redactions(); len(where) > before {
		// A trailer: the header went out before the body was read.
		w.Header().Set(http.TrailerPrefix+WarningField, upstream.RedactionWarning(where))
	}
	if err != nil {
		// What came goes out, then the exchange ends without its last
		// chunk: the caller sees a body cut short, not a short body.
		_ = http.NewResponseController(w).Flush()
		if errors.Is(err, errCallerGone) {
			return fmt.Errorf("after %d bytes: %w", n, err)
		}
		return brokenBody(err, n, resp.ContentLength)
	}
	return nil
}

// decidedWait is the wait mcp-quota decided after an answer: the
// upstream's Retry-After as read (a valid one, capped), or longer when
// the gate, the backoff or the circuit set more, or the advice pauses
// longer; 0 when none.
func decidedWait(resp *upstream.Response) time.Duration {
	res := resp.Result
	d := res.RetryIn
	if res.Advice.Action == pacer.Pause {
		d = max(d, res.Advice.RetryAfter)
	}
	if resp.Reading.HasRetryAfter {
		d = max(d, resp.Reading.RetryAfter)
	}
	return d
}
