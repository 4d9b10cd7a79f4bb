package tools

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// DefaultAnswerTimeout bounds a fetch's whole answer, header and body,
// once it was admitted (see upstream.Request.AnswerTimeout).
const DefaultAnswerTimeout = 60 * time.Second

func (d *Deps) answerTimeout() time.Duration {
	if d.AnswerTimeout > 0 {
		return d.AnswerTimeout
	}
	return DefaultAnswerTimeout
}

// namedFailure is the isError result for the failures a fetch names for
// what they are — the caller's malformed request, mcp-quota's own state
// failing, an upstream that does not answer in time — or nil for the
// others.
func (f *fetchCall) namedFailure(err error) *mcp.CallToolResult {
	switch {
	case errors.Is(err, upstream.ErrBadRequest):
		return failure("badArguments", reason.Sentence(err.Error())+" Nothing was sent, and the key's budget and backoff are untouched.")
	case errors.Is(err, upstream.ErrSentUnrecorded):
		f.d.Log.Error("the state failed after a call went upstream", "key", f.k.Name, "error", err)
		return failure("stateUnavailable", report.Unavailable(err)+": the call went upstream and may have taken effect there, "+
			"but its outcome could not be recorded, so its answer is withheld. Tell the user; check before repeating a request that changes something.")
	case errors.Is(err, upstream.ErrStateUnavailable):
		return f.d.stateUnavailable(f.k.Name, err)
	case errors.Is(err, upstream.ErrBodyMemory):
		return failure("bodyMemory", reason.Sentence(err.Error())+" Try again in a moment, or ask the API for less (a smaller page).")
	case errors.Is(err, upstream.ErrRefusedAnswer):
		return failure("answerRefused", reason.Sentence(err.Error())+" Nothing of it is shown. Tell the user: the API's answer is not one mcp-quota can pass on safely.")
	case errors.Is(err, upstream.ErrAnswerTimeout):
		return failure("upstreamTimeout", fmt.Sprintf("Key '%s': the upstream did not answer within %s; mcp-quota stopped waiting. Try again later, or ask for less (smaller pages).",
			f.k.Name, f.d.answerTimeout()))
	}
	return nil
}

// stateUnavailable is the isError result of a tool whose state file
// failed, and logs why.
func (d *Deps) stateUnavailable(key string, err error) *mcp.CallToolResult {
	d.Log.Error("the state failed", "key", key, "error", err)
	return failure("stateUnavailable", report.Unavailable(err)+", so no call can be admitted or recorded; nothing was sent. Tell the user; try again later.")
}

// stateFailed marks err, from reading or writing the state file, as
// mcp-quota's own storage failing.
func stateFailed(err error) error {
	return fmt.Errorf("%w: %w", upstream.ErrStateUnavailable, err)
}

// bodyCut says why an answer's body read with err after n bytes (of the
// declared length, -1 when none) is incomplete; "" when it is whole.
func (f *fetchCall) bodyCut(err error, n int, declared int64) string {
	if err == nil {
		return ""
	}
	of := ""
	if declared >= 0 {
		of = fmt.Sprintf(" of the %d it announced", declared)
	}
	if errors.Is(err, upstream.ErrAnswerTimeout) {
		return fmt.Sprintf("The upstream was still sending the body after %s, the most mcp-quota waits for an answer: only its first %d bytes%s arrived, so the body is incomplete.",
			f.d.answerTimeout(), n, of)
	}
	return fmt.Sprintf("The upstream's connection broke after %d bytes of the body%s (%v), so the body is incomplete; calling again may get it whole.", n, of, err)
}

// markCut marks a result whose body was cut short by what cut says.
func markCut(r *fetchResult, cut string) {
	if cut == "" {
		return
	}
	r.Truncated = true
	r.Body += "\n[incomplete: " + cut + "]"
	r.Warnings = append(r.Warnings, cut)
}

// redactionWarnings are the warnings of an answer the key's credential
// was removed from.
func redactionWarnings(resp *upstream.Response) []string {
	if where := resp.Redactions(); len(where) > 0 {
		return []string{upstream.RedactionWarning(where)}
	}
	return nil
}

// scrubStored removes the key's credential from a stored answer (one kept
// before answers were scrubbed, or by another version).
func scrubStored(k *keystore.Key, r ledger.StoredResponse) ledger.StoredResponse {
	s := k.Scrubber()
	r.Body, _ = s.ScrubBytes(r.Body)
	r.ContentType, _ = s.Scrub(r.ContentType)
	r.ETag, _ = s.Scrub(r.ETag)
	r.LastModified, _ = s.Scrub(r.LastModified)
	return r
}

// unknownKey is the message for a key name the store does not hold (or
// none, where several are configured), naming only the keys caller may
// use.
func unknownKey(keys *keystore.Store, caller *keystore.Caller, name string) string {
	own := keys.For(caller)
	if k, err := own.Key(name); err != nil {
		return reason.Sentence(err.Error())
	} else if name == "" {
		return fmt.Sprintf("Name the key: key=%q is the one you may use.", k.Name)
	}
	return reason.Sentence(fmt.Sprintf("%v %q", keystore.ErrUnknownKey, name))
}

// ownKeysOnly is the tool filter that describes fetch to each caller with
// only the keys it may use. The server runs it on every tools/call too,
// so the description it makes (whose output schema is reflected from
// fetchResult) is made once per set of keys and kept.
func (d *Deps) ownKeysOnly(ctx context.Context, ts []mcp.Tool) []mcp.Tool {
	caller := d.caller(ctx)
	if caller.MayUse("*") {
		return ts
	}
	out := slices.Clone(ts)
	for i, t := range out {
		if t.Name == "fetch" {
			out[i] = d.fetchTools.get(d.Keys.For(caller))
		}
	}
	return out
}

// fetchTools keeps the fetch tool's description per set of keys it
// names. The zero value is empty and ready; it is safe for concurrent
// use.
type fetchTools struct {
	mu    sync.Mutex
	tools map[string]mcp.Tool
}

// maxFetchTools bounds how many descriptions fetchTools keeps: a set of
// keys per group of callers, and after a reload the sets of the new
// configuration. Past it, the kept ones are dropped and made again.
const maxFetchTools = 64

// get returns fetchTool(keys), made once for keys' names and methods.
func (c *fetchTools) get(keys *keystore.Store) mcp.Tool {
	var id strings.Builder
	for _, k := range keys.Keys() {
		// What fetchTool reads of a key: its name and whether it is
		// read-only.
		fmt.Fprintf(&id, "%q %t\n", k.Name, k.ReadOnly())
	}
	c.mu.Lock()
	t, ok := c.tools[id.String()]
	c.mu.Unlock()
	if ok {
		return t
	}
	t = fetchTool(keys)
	c.mu.Lock()
	if c.tools == nil || len(c.tools) >= maxFetchTools {
		c.tools = map[string]mcp.Tool{}
	}
	c.tools[id.String()] = t
	c.mu.Unlock()
	return t
}
