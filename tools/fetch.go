package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// FetchLimits bound the fetch tool. A zero field means its default.
type FetchLimits struct {
	DefaultMaxWait   time.Duration // 5 s: how long a call waits for admission unless max_wait_s says otherwise
	MaxMaxWait       time.Duration // 60 s: the most max_wait_s may ask for
	DefaultMaxLength int           // 8000 characters of body per result
	MaxLength        int           // 25000: the most max_length may ask for
	MaxResult        int           // 60000 characters: the whole result, text block and structuredContent together
	MaxBody          int64         // 8 MiB read from the upstream; the rest is cut
	LoopWindow       time.Duration // 10 min: identical requests within it are noticed
	LoopLimit        int           // 5: from the 6th identical unchanged request on, answer from the last answer
	KeepResponses    int           // 32 answers kept per key for conditional requests, paging and the loop guard
	KeepBody         int64         // 2 MiB: larger answers are not kept (each page is then fetched again)
	PageTTL          time.Duration // 10 min: start_index > 0 pages through a kept answer this young
}

// withDefaults is l with each limit not set (zero or less) at its default,
// as FetchLimits' fields say.
func (l FetchLimits) withDefaults() FetchLimits {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.DefaultMaxWait, 5*time.Second)
	def(&l.MaxMaxWait, 60*time.Second)
	def(&l.LoopWindow, 10*time.Minute)
	def(&l.PageTTL, 10*time.Minute)
	if l.DefaultMaxLength <= 0 {
		l.DefaultMaxLength = 8000
	}
	if l.MaxLength <= 0 {
		l.MaxLength = 25000
	}
	if l.MaxResult <= 0 {
		l.MaxResult = 60000
	}
	if l.MaxBody <= 0 {
		l.MaxBody = 8 << 20
	}
	if l.LoopLimit <= 0 {
		l.LoopLimit = 5
	}
	if l.KeepResponses <= 0 {
		l.KeepResponses = 32
	}
	if l.KeepBody <= 0 {
		l.KeepBody = 2 << 20
	}
	return l
}

type fetchArgs struct {
	Key        string            `json:"key,omitempty" jsonschema:"the configured key to call through; may be omitted when exactly one key is configured"`
	Method     string            `json:"method,omitempty" jsonschema:"HTTP method; default GET. The key's configuration says which methods are open"`
	Path       string            `json:"path" jsonschema:"path below the key's base URL, e.g. /v1/participants?limit=500; no absolute URLs"`
	Query      map[string]string `json:"query,omitempty" jsonschema:"query parameters to add"`
	Headers    map[string]string `json:"headers,omitempty" jsonschema:"request headers; credentials are added by mcp-quota and any you send are dropped"`
	Body       string            `json:"body,omitempty" jsonschema:"request body, for methods that take one"`
	MaxWaitS   *float64          `json:"max_wait_s,omitempty" jsonschema:"seconds you are willing to wait for the budget before the call goes (default 5, at most 60); beyond it the answer is pause"`
	MaxLength  *int              `json:"max_length,omitempty" jsonschema:"characters of body to return (default 8000, at most 25000); the whole result stays under 60000 characters"`
	StartIndex *int              `json:"start_index,omitempty" jsonschema:"character offset to read the body from, to page through a long body (default 0)"`
}

// fetchBounds are how long a fetch waits for the budget and which page
// of the body it returns, and what the agent asked for of each bound.
type fetchBounds struct {
	maxWait       time.Duration
	maxLen, start int
	// askedLen is the max_length asked for, when one was.
	askedLen int
	// askedWait is the max_wait_s asked for, when one was.
	askedWait time.Duration
}

// bounds returns a's max_wait_s, max_length and start_index within lim,
// their defaults where a has none; bad, when not empty, says which one
// is not valid, for the agent.
func (a fetchArgs) bounds(lim FetchLimits) (b fetchBounds, bad string) {
	b = fetchBounds{maxWait: lim.DefaultMaxWait, maxLen: lim.DefaultMaxLength}
	if a.MaxWaitS != nil {
		if *a.MaxWaitS < 0 {
			return b, "max_wait_s must be 0 or more seconds."
		}
		b.askedWait = time.Duration(*a.MaxWaitS * float64(time.Second))
		b.maxWait = min(b.askedWait, lim.MaxMaxWait)
	}
	if a.MaxLength != nil {
		if *a.MaxLength <= 0 {
			return b, "max_length must be at least 1."
		}
		b.askedLen = *a.MaxLength
		b.maxLen = min(b.askedLen, lim.MaxLength)
	}
	if a.StartIndex != nil {
		if *a.StartIndex < 0 {
			return b, "start_index must be 0 or more."
		}
		b.start = *a.StartIndex
	}
	return b, ""
}

type fetchResult struct {
	Key            string            `json:"key" jsonschema:"the key the call went through"`
	Method         string            `json:"method"`
	Path           string            `json:"path" jsonschema:"path and query below the key's base URL"`
	Sent           bool              `json:"sent" jsonschema:"whether a request went upstream for this call"`
	Status         int               `json:"status" jsonschema:"the upstream's HTTP status; 0 when nothing was sent"`
	Headers        map[string]string `json:"headers" jsonschema:"selected response headers (never credentials)"`
	ContentType    string            `json:"content_type"`
	Body           string            `json:"body" jsonschema:"the body (or the page of it from start_index); described, not shown, when binary"`
	Truncated      bool              `json:"truncated" jsonschema:"the body continues past this page; read on with start_index=next_start_index"`
	TotalLength    int               `json:"total_length" jsonschema:"the whole body's length in characters"`
	NextStartIndex int               `json:"next_start_index,omitempty"`
	Binary         bool              `json:"binary,omitempty"`
	NotModified    bool              `json:"not_modified" jsonschema:"the upstream answered 304: the body is the kept copy (a 304 still counts against the quota)"`
	FromCache      bool              `json:"from_cache" jsonschema:"answered from mcp-quota's kept copy without calling the upstream or spending quota"`
	Next           *nextCall         `json:"next,omitempty" jsonschema:"the next page, when the answer links one"`
	Quota          report.Quota      `json:"quota"`
	Advice         report.Advice     `json:"advice"`
	Attempts       int               `json:"attempts" jsonschema:"requests sent upstream for this call, retries included"`
	WaitedS        float64           `json:"waited_s" jsonschema:"seconds spent waiting for the budget"`
	Warnings       []string          `json:"warnings,omitempty"`
}

type nextCall struct {
	Path string `json:"path" jsonschema:"call fetch with this path for the next page"`
}

func fetchTool(keys *keystore.Store) mcp.Tool {
	readOnly := true
	for _, k := range keys.Keys() {
		readOnly = readOnly && k.ReadOnly()
	}
	desc := "Call an HTTP API through a configured key (" + keyList(keys.KeyNames()) + "). " +
		"mcp-quota adds the credential, waits for the key's shared budget (up to max_wait_s) and returns the answer with quota and advice. " +
		"When advice.action is pause, do not call again before advice.retry_after_s. Long bodies are paged with start_index."
	return mcp.NewTool("fetch",
		mcp.WithDescription(desc),
		rawInputSchema(fetchInput),
		mcp.WithRawOutputSchema(fetchOutputSchema()),
		mcp.WithTitleAnnotation("Quota-aware HTTP fetch"),
		mcp.WithReadOnlyHintAnnotation(readOnly),
		mcp.WithDestructiveHintAnnotation(!readOnly),
		mcp.WithIdempotentHintAnnotation(readOnly),
		mcp.WithOpenWorldHintAnnotation(true),
	)
}

// keyList names keys in at most about 200 characters, however many there
// are: a tool description is in the model's context on every turn.
func keyList(names []string) string {
	const room = 200
	var b strings.Builder
	for i, name := range names {
		if i > 0 && b.Len()+len(name) > room {
			fmt.Fprintf(&b, " and %d more; quota_status lists them", len(names)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(name)
	}
	return b.String()
}

// fetch is the fetch tool: it checks the arguments against the key and
// the bounds, answers a GET from a kept copy when one may be reused, and
// otherwise sends the call through the upstream client, which paces it.
// Every failure is a tool result an agent can act on (isError, with a
// code), never a protocol error.
func (d *Deps) fetch(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var a fetchArgs
	if err := req.BindArguments(&a); err != nil {
		return failure("badArguments", "The arguments are not valid: give path (a string) and optionally key, method, query, headers and body."), nil
	}
	lim := d.Fetch.withDefaults()
	caller := d.caller(ctx)
	k, err := d.Keys.Key(a.Key)
	if err != nil || !caller.MayUse(k.Name) { // a key not the caller's is one that does not exist
		return failure("unknownKey", unknownKey(d.Keys, caller, a.Key)), nil
	}
	method := strings.ToUpper(a.Method)
	if method == "" {
		method = http.MethodGet
	}
	if !k.AllowsMethod(method) {
		return failure("methodNotAllowed", fmt.Sprintf("Key '%s' allows only %s through fetch.", k.Name, strings.Join(k.Methods, ", "))), nil
	}
	b, bad := a.bounds(lim)
	if bad != "" {
		return failure("badArguments", bad), nil
	}
	query := url.Values{}
	for name, v := range a.Query {
		query.Set(name, v)
	}
	u, err := upstream.Resolve(k.BaseURL, a.Path, query)
	if err != nil {
		return failure("badPath", reason.Sentence(err.Error())+" Give a path below the key's base URL, like /v1/items?limit=100."), nil
	}
	target := upstream.ActivityTarget(k, u)
	var body []byte
	if a.Body != "" {
		body = []byte(a.Body)
	}
	digest := upstream.Digest(method, target, body)
	header := http.Header{}
	for name, v := range a.Headers {
		header.Set(name, v)
	}

	f := fetchCall{d: d, lim: lim, k: k, caller: caller, method: method, target: target, digest: digest, fetchBounds: b,
		sent: upstream.SentHeader(k, header), hold: d.Client.BodyHold(),
		ownConditional: header.Get("If-None-Match") != "" || header.Get("If-Modified-Since") != ""}
	defer f.hold.Release()
	if method == http.MethodGet {
		if res, ok, err := f.fromStored(ctx, header); errors.Is(err, upstream.ErrBodyMemory) {
			return f.namedFailure(err), nil
		} else if err != nil {
			return f.namedFailure(stateFailed(err)), nil
		} else if ok {
			return res, nil
		}
	}
	resp, err := d.Client.Do(ctx, k, upstream.Request{Caller: caller.Name, Transport: d.Transport, Method: method,
		Path: a.Path, Query: query, Header: header, Body: body, MaxWait: f.maxWait, Progress: progressSender(ctx, req, k.Name),
		Digest: digest, AnswerTimeout: d.answerTimeout(), MaxDecoded: lim.MaxBody + decodeMargin, Hold: f.hold})
	if err != nil {
		if res := f.namedFailure(err); res != nil {
			return res, nil
		}
		return f.failed(err), nil
	}
	defer resp.Body.Close()
	return f.answered(ctx, resp)
}

// fetchCall is one fetch in progress.
type fetchCall struct {
	d      *Deps
	lim    FetchLimits
	k      *keystore.Key
	caller *keystore.Caller
	method string
	target string
	digest string
	fetchBounds
	stored    ledger.StoredResponse
	hasStored bool
	repeats   int
	// sent is what the request goes upstream with (see
	// upstream.SentHeader): what a stored answer's Vary is matched against.
	sent http.Header
	// ownConditional is set when the caller sent its own validator: a 304
	// then answers the caller's question, and no kept body is shown.
	ownConditional bool
	hold           *upstream.BodyHold
}

// decodeMargin is how far past MaxBody a compressed answer is decoded:
// the scrubber reads a little ahead of what it passes on, so that the
// body is cut at MaxBody, with the credential removed up to there.
const decodeMargin = 64 << 10

// fromStored answers from the stored copy when that is the right thing: a
// page beyond the first of a body fetched moments ago, or a request
// repeated past the loop limit whose answer has not been changing. It
// also arms the conditional request.
func (f *fetchCall) fromStored(ctx context.Context, header http.Header) (*mcp.CallToolResult, bool, error) {
	now := f.d.now()
	if f.start == 0 && f.d.stored.absent(f.k.Name, f.target) {
		return nil, false, nil // nothing kept to read (see keptIndex)
	}
	var targets []string
	var listed bool
	err := f.d.DB.View(ctx, func(tx ledger.ReadTx) error {
		var err error
		if !f.d.stored.loaded(f.k.Name) {
			if targets, listed, err = readStoredTargets(tx, f.k.Name); err != nil {
				return err
			}
		}
		if f.stored, f.hasStored, err = tx.Response(f.k.Name, f.target); err != nil || !f.hasStored {
			return err
		}
		f.repeats, err = tx.Repeats(f.k.Name, f.caller.Name, f.digest, now.Add(-f.lim.LoopWindow))
		return err
	})
	if err != nil {
		return nil, false, err
	}
	if listed {
		f.d.stored.set(f.k.Name, targets, 0, "")
	}
	if !f.hasStored {
		return nil, false, nil
	}
	if !reusable(f.stored, f.sent) {
		// Another variant's answer (or one that varies on everything):
		// this request neither sees it nor is made conditional on it.
		f.hasStored, f.stored = false, ledger.StoredResponse{}
		return nil, false, nil
	}
	if err := f.hold.Grow(int64(len(f.stored.Body))); err != nil {
		return nil, false, err
	}
	f.stored = scrubStored(f.k, f.stored)
	switch {
	case f.start > 0 && now.Sub(f.stored.StoredAt) < f.lim.PageTTL:
		res, err := f.storedResult(ctx, now, "", reason.Reason{Kind: reason.KeptPage, For: now.Sub(f.stored.StoredAt)})
		return res, true, err
	case f.repeats >= f.lim.LoopLimit && f.stored.Unchanged >= 1:
		res, err := f.storedResult(ctx, now, f.digest, reason.Reason{Kind: reason.LoopGuard})
		return res, true, err
	}
	if header.Get("If-None-Match") == "" && header.Get("If-Modified-Since") == "" {
		if f.stored.ETag != "" {
			header.Set("If-None-Match", f.stored.ETag)
		} else if f.stored.LastModified != "" {
			header.Set("If-Modified-Since", f.stored.LastModified)
		}
	}
	return nil, false, nil
}

// keep stores r as the stored answer of its target, and reads the key's
// kept targets again in the same transaction (see storedIndex): through
// the process's journal where the store has one (see laterKeeper),
// otherwise in a write transaction of its own.
func (f *fetchCall) keep(ctx context.Context, r ledger.StoredResponse) error {
	if k, ok := f.d.DB.(laterKeeper); ok {
		x := &f.d.stored
		x.pend(r.Key, r.Target, 1)
		err := k.KeepLater(ctx, r, f.lim.KeepResponses, func(targets []string) {
			x.set(r.Key, targets, x.next(), r.Target)
			x.pend(r.Key, r.Target, -1)
		})
		if err != nil {
			x.pend(r.Key, r.Target, -1)
		}
		return err
	}
	var targets []string
	var listed bool
	var seq uint64
	err := f.d.DB.Update(ctx, func(tx ledger.Tx) error {
		var err error
		seq = f.d.stored.next()
		targets, listed, err = keepResponse(tx, r, f.lim.KeepResponses)
		return err
	})
	if err != nil {
		return err
	}
	if listed {
		f.d.stored.set(r.Key, targets, seq, r.Target)
	}
	return nil
}

// storedResult answers from the stored copy, spending nothing, and records
// that in the activity.
func (f *fetchCall) storedResult(ctx context.Context, now time.Time, digest string, why reason.Reason) (*mcp.CallToolResult, error) {
	err := f.d.Client.RecordCached(ctx, f.k, upstream.Request{Caller: f.caller.Name, Transport: f.d.Transport, Method: f.method, Digest: digest}, f.target, why, now)
	if err != nil {
		return nil, err
	}
	st, err := f.d.Pacer.Status(ctx, f.k, f.caller.Name)
	if err != nil {
		return nil, err
	}
	r := f.result(f.stored.Status, nil, f.stored.ContentType, f.stored.Body, true)
	r.FromCache = true
	r.Quota, r.Advice = report.NewQuota(f.k.Name, st.Binding), report.WaitInstead(report.NewAdvice(st.Advice), f.lim.MaxMaxWait)
	if digest != "" {
		r.Advice = loopAdvice(r.Advice, f.repeats+1, f.lim.LoopWindow, true)
	}
	return f.fitted(r, f.stored.Body, true), nil
}

// answered turns the upstream's answer into the tool result, keeping GET
// answers for conditional requests and the loop guard.
func (f *fetchCall) answered(ctx context.Context, resp *upstream.Response) (*mcp.CallToolResult, error) {
	raw, err := upstream.ReadBody(resp.Body, f.lim.MaxBody, resp.Hold)
	if errors.Is(err, upstream.ErrBodyMemory) {
		return f.namedFailure(err), nil
	}
	cut := f.bodyCut(err, len(raw), resp.ContentLength) // a broken body is not a long one
	complete := err == nil && int64(len(raw)) <= f.lim.MaxBody
	if int64(len(raw)) > f.lim.MaxBody {
		raw = raw[:f.lim.MaxBody]
	}
	ct := resp.Header.Get("Content-Type")
	// A 304 shows the kept body only when it answers mcp-quota's own
	// conditional, armed from that very copy, and names it (RFC 9111
	// §4.3.4).
	notModified := resp.StatusCode == http.StatusNotModified && f.hasStored && !f.ownConditional && sameValidator(resp.Header, f.stored)
	if notModified {
		raw, ct, complete, cut = f.stored.Body, f.stored.ContentType, true, ""
	}
	unchanged := false
	if f.method == http.MethodGet && complete && int64(len(raw)) <= f.lim.KeepBody && (resp.StatusCode == http.StatusOK || notModified) {
		unchanged = f.keepAnswer(ctx, resp.Header, ct, raw, notModified)
	}
	stale := resp.StatusCode == http.StatusNotModified && f.hasStored && !f.ownConditional && !notModified
	if stale {
		// A 304 for another version than the kept one: the stored answer
		// must not answer the next request either, which then goes
		// unconditionally.
		err := f.keep(ctx, f.standIn())
		if err != nil {
			f.d.Log.Error("dropping a kept answer failed", "key", f.k.Name, "error", err)
		}
	}
	status := resp.StatusCode
	if notModified {
		status = http.StatusNotModified
	}
	r := f.result(status, resp.Header, ct, raw, complete || cut != "")
	markCut(&r, cut)
	if stale {
		r.Warnings = append(r.Warnings, "The upstream answered 304 Not Modified for another version than the one mcp-quota kept, so there is no body to show; call again to get it whole.")
	}
	r.Sent, r.NotModified = true, notModified
	r.Attempts, r.WaitedS = resp.Attempts, resp.Waited.Seconds()
	r.Quota, r.Advice = report.NewQuota(f.k.Name, resp.Result.Binding), report.WaitInstead(report.NewAdvice(resp.Result.Advice), f.lim.MaxMaxWait)
	if f.repeats > 0 && unchanged {
		r.Advice = loopAdvice(r.Advice, f.repeats+1, f.lim.LoopWindow, false)
	}
	for _, w := range resp.Result.Warnings {
		r.Warnings = append(r.Warnings, w.String())
		f.d.warn(ctx, w.String())
	}
	r.Warnings = append(r.Warnings, redactionWarnings(resp)...)
	r.Next = nextPage(resp.Header, f.k)
	return f.fitted(r, raw, complete), nil
}

// keepAnswer keeps raw, the whole body of a 200 or of the kept copy a 304
// named (notModified), for the fetches of the same target after it, and
// reports whether it is the body kept before.
func (f *fetchCall) keepAnswer(ctx context.Context, h http.Header, ct string, raw []byte, notModified bool) (unchanged bool) {
	sum := upstream.Digest("", "", raw)
	vary := varyOf(h)
	if notModified && h.Get("Vary") == "" {
		vary = f.stored.Vary
	}
	kept := ledger.StoredResponse{Key: f.k.Name, Target: f.target, ETag: h.Get("ETag"),
		LastModified: h.Get("Last-Modified"), Status: http.StatusOK, ContentType: ct, Body: raw,
		Digest: sum, StoredAt: f.d.now(), Vary: vary, Varied: varied(vary, f.sent)}
	if notModified {
		kept.ETag, kept.LastModified = f.stored.ETag, f.stored.LastModified
	}
	if vary == varyStar {
		kept = f.standIn()
	}
	if f.hasStored && f.stored.Digest == sum {
		unchanged = true
		kept.Unchanged = f.stored.Unchanged + 1
	}
	if err := f.keep(ctx, kept); err != nil {
		f.d.Log.Error("keeping an answer failed", "key", f.k.Name, "error", err)
	}
	return unchanged
}

// standIn is the row kept in the place of the target's answer when no
// later request may get it (Vary: *, or a 304 for another version): it is
// never reused.
func (f *fetchCall) standIn() ledger.StoredResponse {
	return ledger.StoredResponse{Key: f.k.Name, Target: f.target, Status: http.StatusOK, StoredAt: f.d.now(), Vary: varyStar}
}

// result builds the parts of a result every path shares.
func (f *fetchCall) result(status int, h http.Header, ct string, raw []byte, complete bool) fetchResult {
	pg := page(raw, ct, f.start, f.maxLen, complete)
	return fetchResult{Key: f.k.Name, Method: f.method, Path: f.target, Status: status, Headers: selectHeaders(h),
		ContentType: ct, Body: pg.body, Truncated: pg.truncated, TotalLength: pg.total, NextStartIndex: pg.next, Binary: pg.binary}
}

// fitted renders r, whose body page was cut from raw, cutting the page
// shorter until the whole result — the text block and structuredContent
// together, as JSON — is at most MaxResult characters. The body is in both
// blocks (some clients show the model only one of them), and JSON escaping
// can make a character of body take six, so the page length is searched
// by what the result measures, not guessed.
func (f *fetchCall) fitted(r fetchResult, raw []byte, complete bool) *mcp.CallToolResult {
	if f.askedLen > f.maxLen {
		r.Warnings = append(slices.Clone(r.Warnings), fmt.Sprintf("max_length is at most %d characters; this page has at most that many.", f.maxLen))
	}
	r.Warnings = f.waitCapped(r.Warnings)
	res := render(r, false)
	if r.Binary || resultFits(res, f.lim.MaxResult) {
		return res
	}
	warnings := r.Warnings
	cut := func(n int) *mcp.CallToolResult {
		pg := page(raw, r.ContentType, f.start, n, complete)
		r.Body, r.Truncated, r.TotalLength, r.NextStartIndex = pg.body, pg.truncated, pg.total, pg.next
		r.Warnings = append(slices.Clone(warnings), fmt.Sprintf(
			"mcp-quota cut the body page to %d characters so the whole result stays under %d; read on with start_index=%d.",
			n, f.lim.MaxResult, pg.next))
		return render(r, false)
	}
	// The longest page that fits lies in [lo, hi): lo fits, hi does not.
	lo, hi := 0, f.maxLen
	var best *mcp.CallToolResult
	for hi-lo > max(1, hi/64) {
		mid := (lo + hi) / 2
		if res := cut(max(mid, 1)); resultChars(res) <= f.lim.MaxResult {
			lo, best = mid, res
		} else {
			hi = mid
		}
	}
	if best == nil {
		return cut(1)
	}
	return best
}

// resultChars is the size of res as a client receives it: its JSON, in
// characters. A structuredContent already encoded (see render) is counted
// as it is, not encoded again.
func resultChars(res *mcp.CallToolResult) int {
	sc, ok := res.StructuredContent.(json.RawMessage)
	if !ok {
		b, err := json.Marshal(res)
		if err != nil {
			return 0
		}
		return utf8.RuneCount(b)
	}
	rest := *res
	rest.StructuredContent = nil
	b, err := json.Marshal(rest)
	if err != nil {
		return 0
	}
	return utf8.RuneCount(b) + len(`,"structuredContent":`) + utf8.RuneCount(sc)
}

// resultFits reports whether res, as render made it, is at most max
// characters as a client receives it (see resultChars). A result that
// would fit even if JSON escaped every byte of its text block into six
// characters (\u00XX, the longest escape of one) is not encoded again to
// be measured: most results are far below the limit.
func resultFits(res *mcp.CallToolResult, max int) bool {
	sc, ok := res.StructuredContent.(json.RawMessage)
	if ok && len(res.Content) == 1 {
		if t, ok := res.Content[0].(mcp.TextContent); ok && resultEnvelope+6*len(t.Text)+len(sc) <= max {
			return true
		}
	}
	return resultChars(res) <= max
}

// resultEnvelope is what a result of render's shape measures besides its
// text and its structured form: the most of it, an error's.
var resultEnvelope = func() int {
	res := mcp.NewToolResultStructured(json.RawMessage(nil), "")
	res.IsError = true
	return resultChars(res)
}()

// waitCapped adds to warnings that max_wait_s was capped, when it was:
// the agent must not believe it waited as long as it asked.
func (f *fetchCall) waitCapped(warnings []string) []string {
	if f.askedWait <= f.lim.MaxMaxWait {
		return warnings
	}
	return append(slices.Clone(warnings), fmt.Sprintf("max_wait_s is at most %d seconds; this call waited at most that long.",
		int(f.lim.MaxMaxWait/time.Second)))
}

// failed turns a call that got no answer into an isError result an agent
// can act on.
func (f *fetchCall) failed(err error) *mcp.CallToolResult {
	var pe *pacer.PauseError
	var pathErr *upstream.PathError
	switch {
	case errors.As(err, &pe):
		r := fetchResult{Key: f.k.Name, Method: f.method, Path: f.target, Headers: map[string]string{},
			Quota: report.NewQuota(f.k.Name, pe.Binding), Advice: report.Paused(f.k.Name, pe, f.lim.MaxMaxWait),
			Warnings: f.waitCapped(nil)}
		return render(r, true)
	case errors.As(err, &pathErr):
		return failure("badPath", reason.Sentence(err.Error()))
	case errors.Is(err, keystore.ErrNoCredential):
		return failure("noCredential", reason.Sentence(err.Error())+" Ask the user to set it and restart mcp-quota.")
	case errors.Is(err, upstream.ErrForbiddenAddress):
		return failure("forbiddenAddress", reason.Sentence(err.Error()))
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return failure("cancelled", "The call was cancelled before an answer came.")
	case errors.Is(err, upstream.ErrUnreachable):
		if f.k.UnreachableHint != "" {
			return failure("upstreamUnavailable", reason.Sentence(err.Error())+" "+reason.Sentence(f.k.UnreachableHint))
		}
		return failure("upstreamUnavailable", reason.Sentence(err.Error())+" Try again later.")
	}
	return failure("failed", reason.Sentence(err.Error()))
}

// loopAdvice adds the loop guard's advice to a: n identical requests in
// window, the last answered from the stored copy when stored.
func loopAdvice(a report.Advice, n int, window time.Duration, stored bool) report.Advice {
	msg := fmt.Sprintf("You made this same request %d times in %s and the answer did not change", n, ago(window))
	if stored {
		msg += "; this answer is mcp-quota's kept copy and spent no quota"
	}
	msg += ". Instead of repeating it: ask for large pages (limit=500), sync with updatedSince, or use webhooks for what just happened."
	if a.Action == string(pacer.Continue) {
		a.Action = string(pacer.SlowDown)
		a.Reason = msg
	} else {
		a.Reason = msg + " " + a.Reason
	}
	return a
}

// progressSender returns a Progress func that sends MCP progress
// notifications, or nil when the client asked for none.
func progressSender(ctx context.Context, req mcp.CallToolRequest, key string) func(pacer.Progress) {
	m := req.Params.Meta
	s := server.ServerFromContext(ctx)
	if m == nil || m.ProgressToken == nil || s == nil {
		return nil
	}
	return func(p pacer.Progress) {
		_ = s.SendNotificationToClient(ctx, "notifications/progress", map[string]any{
			"progressToken": m.ProgressToken,
			"progress":      p.Waited.Seconds(),
			"total":         p.Total.Seconds(),
			"message":       fmt.Sprintf("waiting for key '%s' (%.0f s of about %.0f s): %s", key, p.Waited.Seconds(), p.Total.Seconds(), p.Reason),
		})
	}
}

// shownHeaders are the response headers a result shows.
var shownHeaders = []string{"Content-Type", "Content-Length", "Content-Encoding", "ETag", "Last-Modified", "Cache-Control",
	"Date", "Link", "Location", "Retry-After", "Age"}

func selectHeaders(h http.Header) map[string]string {
	out := map[string]string{}
	for _, name := range shownHeaders {
		if v := h.Values(name); len(v) > 0 {
			out[name] = strings.Join(v, ", ")
		}
	}
	return out
}

// nextPage returns the next call when the answer links a next page below
// the key's base URL.
func nextPage(h http.Header, k *keystore.Key) *nextCall {
	for _, link := range h.Values("Link") {
		for _, part := range strings.Split(link, ",") {
			ref, params, ok := strings.Cut(strings.TrimSpace(part), ";")
			if !ok || !strings.HasPrefix(ref, "<") || !strings.HasSuffix(ref, ">") || !relNext(params) {
				continue
			}
			u, err := k.BaseURL.Parse(strings.Trim(ref, "<>"))
			if err != nil || u.Host != k.BaseURL.Host || !strings.HasPrefix(u.Path, k.BaseURL.Path) {
				continue
			}
			// Without the key's own query parameter (mcp-quota adds it) and
			// without the credential in any form.
			return &nextCall{Path: upstream.ActivityTarget(k, u)}
		}
	}
	return nil
}

func relNext(params string) bool {
	for _, p := range strings.Split(params, ";") {
		name, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		if strings.EqualFold(name, "rel") {
			for _, r := range strings.Fields(strings.Trim(v, `"`)) {
				if strings.EqualFold(r, "next") {
					return true
				}
			}
		}
	}
	return false
}

func isJSON(ct string) bool {
	mt, _, _ := mime.ParseMediaType(ct)
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

func ago(d time.Duration) string { return reason.Duration(d) }
