package tools

import (
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// bodyPage is the part of a body a result shows.
type bodyPage struct {
	body      string
	truncated bool
	total     int // characters in the whole body
	next      int // start_index of the next page; 0 when there is none
	binary    bool
}

// page cuts the page [start, start+maxLen) characters out of raw. Binary
// content is described, not shown. A cut body ends with a marker saying
// where to read on; complete is false when raw itself was cut short.
func page(raw []byte, contentType string, start, maxLen int, complete bool) bodyPage {
	if len(raw) == 0 {
		return bodyPage{}
	}
	if binary(raw, contentType) {
		mt, _, _ := mime.ParseMediaType(contentType)
		if mt == "" {
			mt = "unknown type"
		}
		return bodyPage{binary: true, total: len(raw),
			body: fmt.Sprintf("[binary content: %s, %d bytes; not shown]", mt, len(raw))}
	}
	text := string(raw)
	total := utf8.RuneCountInString(text)
	if start >= total {
		return bodyPage{total: total, body: fmt.Sprintf("[no more content: the body has %d characters]", total)}
	}
	// Convert character offsets to byte offsets.
	from, to, n := len(text), len(text), 0
	for i := range text {
		if n == start {
			from = i
		}
		if n == start+maxLen {
			to = i
			break
		}
		n++
	}
	p := bodyPage{body: text[from:to], total: total}
	if to < len(text) {
		p.truncated, p.next = true, start+maxLen
		kind := ""
		if isJSON(contentType) {
			kind = " (the JSON is cut: it is not valid on its own)"
		}
		p.body += fmt.Sprintf("\n[truncated%s: characters %d to %d of %d shown; call fetch again with start_index=%d to read on]",
			kind, start, start+maxLen, total, p.next)
	} else if !complete {
		p.truncated = true
		p.body += "\n[truncated: the body was larger than mcp-quota reads; the rest was not fetched]"
	}
	return p
}

// binary reports whether raw is not text: its media type says so, or it
// is not valid UTF-8.
func binary(raw []byte, contentType string) bool {
	mt, _, _ := mime.ParseMediaType(contentType)
	textual := mt == "" || strings.HasPrefix(mt, "text/") || isJSON(contentType) || strings.HasSuffix(mt, "+xml") ||
		mt == "application/xml" || mt == "application/javascript" || mt == "application/x-www-form-urlencoded" ||
		mt == "application/graphql-response+json" || mt == "application/yaml"
	if !textual {
		return true
	}
	sample := raw
	if len(sample) > 64<<10 {
		sample = sample[:64<<10]
		for len(sample) > 0 && !utf8.RuneStart(sample[len(sample)-1]) {
			sample = sample[:len(sample)-1]
		}
		if len(sample) > 0 {
			sample = sample[:len(sample)-1] // the last rune may be cut
		}
	}
	return !utf8.Valid(sample)
}

// maxHeaderShown bounds each response header value a result shows.
const maxHeaderShown = 1000

// render turns a fetch result into the tool result: everything in
// structuredContent (some clients show the model only that), and a short
// text rendering that starts with the advice when it is not continue.
func render(r fetchResult, isError bool) *mcp.CallToolResult {
	for name, v := range r.Headers {
		if len(v) > maxHeaderShown {
			// Invalid bytes become U+FFFD, as JSON encodes a shorter
			// value's: dropping them would join what they split, and an
			// upstream can split the credential with one to slip it past
			// the scrubber.
			r.Headers[name] = strings.ToValidUTF8(v[:maxHeaderShown], "\uFFFD") + "…"
		}
	}
	var b strings.Builder
	switch pacer.Action(r.Advice.Action) {
	case pacer.Pause:
		b.WriteString(r.Advice.Reason + "\n") // "Paused: …" or "Wait 18 s before the next call: …"
	case pacer.SlowDown:
		b.WriteString("Slow down: " + r.Advice.Reason + "\n")
	}
	if r.Sent || r.FromCache {
		fmt.Fprintf(&b, "%s %s -> %d %s", r.Method, r.Path, r.Status, http.StatusText(r.Status))
		switch {
		case r.FromCache:
			b.WriteString(" (from mcp-quota's kept copy; no quota spent)")
		case r.NotModified:
			b.WriteString(" (not modified: the kept copy is shown; a 304 still counts)")
		}
		if q := r.Quota; q.Remaining >= 0 && q.Policy != "" {
			switch q.Unit {
			case string(ratelimit.ConcurrentRequests):
				fmt.Fprintf(&b, "; %d of %d concurrent requests free under policy '%s'", q.Remaining, q.Limit, q.Policy)
			case string(ratelimit.ContentBytes):
				fmt.Fprintf(&b, "; %d of %d content-bytes left for %d s under policy '%s'", q.Remaining, q.Limit, q.ResetS, q.Policy)
			default:
				fmt.Fprintf(&b, "; %d of %d left for %d s under policy '%s'", q.Remaining, q.Limit, q.ResetS, q.Policy)
			}
		}
		b.WriteString("\n")
		if r.Next != nil {
			fmt.Fprintf(&b, "Next page: call fetch with path=%q\n", r.Next.Path)
		}
		b.WriteString(r.Body)
	}
	// The structured form is encoded here, once: measuring the result
	// (see resultChars) and sending it then copy these bytes instead of
	// encoding r again each.
	sc, err := json.Marshal(r)
	if err != nil {
		panic("tools: a fetch result does not marshal: " + err.Error()) // only strings, numbers and maps of strings
	}
	res := mcp.NewToolResultStructured(json.RawMessage(sc), strings.TrimRight(b.String(), "\n"))
	res.IsError = isError
	return res
}

// ErrorMeta is the _meta field that carries an error result's stable code:
// {"mcp-quota/error": {"code": "unknownKey"}}.
const ErrorMeta = "mcp-quota/error"

// failure is an isError result an agent can act on: one sentence in a text
// block, and a stable code in _meta for programs.
//
// It carries no structuredContent. A client that has listed the tools
// validates any structuredContent against the tool's outputSchema, which
// describes a successful answer; the MCP specification (2025-06-18 on)
// requires conformance only of structured results, and the TypeScript SDK
// client skips validation for an isError result without structuredContent.
// A pause is different: it is a full answer (quota and advice) and keeps
// the schema's shape.
func failure(code, message string) *mcp.CallToolResult {
	res := mcp.NewToolResultError(message)
	res.Meta = mcp.NewMetaFromMap(map[string]any{ErrorMeta: map[string]any{"code": code}})
	return res
}

// failureCode returns the stable code of a result failure made, or "".
func failureCode(res *mcp.CallToolResult) string {
	if res == nil || res.Meta == nil {
		return ""
	}
	e, _ := res.Meta.AdditionalFields[ErrorMeta].(map[string]any)
	code, _ := e["code"].(string)
	return code
}
