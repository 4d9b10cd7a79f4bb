package tools

import (
	"net/http"
	"slices"
	"strings"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// The stored copy of a URL's answer is shared by every caller of its key,
// as a shared cache's stored response is (RFC 9111 §4.1): it answers a
// request — a conditional one's 304, a page beyond the first, the loop
// guard — only when that request sends, for every field the answer's
// Vary names, what the request that produced it sent. An answer whose
// Vary is "*" is never reused.

// varyStar is a kept row's Vary for an answer that varies on everything:
// the row keeps no body and answers nothing.
const varyStar = "*"

// varyOf returns the field names h's Vary lists, lower case, sorted,
// without repeats, joined by commas; "*" when it lists "*".
func varyOf(h http.Header) string {
	var names []string
	for _, v := range h.Values("Vary") {
		for _, f := range strings.Split(v, ",") {
			f = strings.ToLower(strings.TrimSpace(f))
			if f == "*" {
				return varyStar
			}
			if f != "" {
				names = append(names, f)
			}
		}
	}
	slices.Sort(names)
	return strings.Join(slices.Compact(names), ",")
}

// varied returns what sent says for each field vary names: one line per
// field, "name: value", the values of a field sent on several lines
// joined by ", " and the space around each comma normalised (RFC 9111
// §4.1 lets a cache normalise so); a field not sent is "name:" with
// nothing after it, so that its absence must match too.
func varied(vary string, sent http.Header) string {
	if vary == "" || vary == varyStar {
		return ""
	}
	var b strings.Builder
	for _, name := range strings.Split(vary, ",") {
		var parts []string
		for _, v := range sent.Values(name) {
			for _, p := range strings.Split(v, ",") {
				parts = append(parts, strings.Join(strings.Fields(p), " "))
			}
		}
		b.WriteString(name)
		b.WriteString(":")
		if len(parts) > 0 {
			b.WriteString(" ")
			b.WriteString(strings.Join(parts, ", "))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// reusable reports whether r may answer a request that goes upstream
// with the fields sent.
func reusable(r ledger.StoredResponse, sent http.Header) bool {
	return r.Vary != varyStar && varied(r.Vary, sent) == r.Varied
}

// sameValidator reports whether a 304's validator names the stored answer
// (RFC 9111 §4.3.4): a 304 whose ETag is not the kept one's answers for
// another representation.
func sameValidator(h http.Header, kept ledger.StoredResponse) bool {
	etag := h.Get("ETag")
	if etag == "" || kept.ETag == "" {
		return true
	}
	return strings.TrimPrefix(etag, "W/") == strings.TrimPrefix(kept.ETag, "W/")
}
