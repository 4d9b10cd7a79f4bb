package rest

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/mcp-quota/mcp-quota/keystore"
)

// responseHopByHop are the response fields a proxy does not pass on
// (RFC 9110 §7.6.1), and the ones that would mislead a caller of
// mcp-quota's address: cookies (scoped to the upstream's site, not ours)
// and Alt-Svc (the upstream's alternative services are not ours).
var responseHopByHop = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Set-Cookie": true, "Set-Cookie2": true, "Alt-Svc": true}

// copyResponseHeaders copies the end-to-end fields of an upstream's answer
// src into dst: none of responseHopByHop and none named by Connection.
func copyResponseHeaders(dst, src http.Header) {
	drop := map[string]bool{}
	for _, v := range src.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			drop[http.CanonicalHeaderKey(strings.TrimSpace(f))] = true
		}
	}
	for name, vs := range src {
		c := http.CanonicalHeaderKey(name)
		if responseHopByHop[c] || drop[c] {
			continue
		}
		dst[c] = append(dst[c][:0:0], vs...)
	}
}

// linkFields are the response fields that carry URI references an
// upstream means relative to itself.
var linkFields = []string{"Location", "Content-Location"}

// rewriteRefs points the URI references of an upstream's answer (in
// Location, Content-Location and every Link target) at the REST side, so
// that a caller following them stays on /k/{key}/… (see rewriteRef).
// from is the URL the answer came from.
func rewriteRefs(h http.Header, k *keystore.Key, from *url.URL) {
	for _, name := range linkFields {
		for i, v := range h[name] {
			h[name][i] = rewriteRef(v, k, from)
		}
	}
	for i, v := range h["Link"] {
		h["Link"][i] = rewriteLink(v, k, from)
	}
}

// rewriteRef maps one URI reference ref, sent in an answer from the URL
// from, to what a caller of the REST side should follow:
//
//   - a reference below the key's base URL becomes the path-absolute
//     /k/{key}/{rest}, with its query and fragment (it resolves against
//     whatever address mcp-quota is reached at);
//   - any other reference becomes the absolute URL it names upstream
//     (another host, or a path outside the base): the caller must go
//     there on its own, and mcp-quota would not forward it;
//   - a reference that does not parse, or whose absolute form would not,
//     is left as it is.
//
// The key's own query credential (auth = "query:NAME") is removed in
// every case.
func rewriteRef(ref string, k *keystore.Key, from *url.URL) string {
	r, err := url.Parse(strings.TrimSpace(ref))
	if err != nil {
		return ref
	}
	if from == nil {
		from = k.BaseURL
	}
	u := from.ResolveReference(r)
	if k.Auth.Kind == keystore.AuthQuery {
		q := u.Query()
		if q.Has(k.Auth.Name) {
			q.Del(k.Auth.Name)
			u.RawQuery = q.Encode()
		}
	}
	base := k.BaseURL
	elsewhere := func() string {
		if out := u.String(); parses(out) {
			return out
		}
		return ref // net/url writes what it cannot read back: keep the upstream's words
	}
	if u.User != nil || !strings.EqualFold(u.Scheme, base.Scheme) || !strings.EqualFold(u.Host, base.Host) {
		return elsewhere()
	}
	rest, ok := strings.CutPrefix(u.EscapedPath(), base.EscapedPath())
	if !ok || strings.HasPrefix(rest, "/") { // an empty segment the REST side would refuse
		return elsewhere()
	}
	out := "/k/" + k.Name + "/" + rest
	if u.ForceQuery || u.RawQuery != "" {
		out += "?" + u.RawQuery
	}
	if u.Fragment != "" {
		out += "#" + u.EscapedFragment()
	}
	return out
}

func parses(s string) bool {
	_, err := url.Parse(s)
	return err == nil
}

// rewriteLink rewrites every target of a Link field value (RFC 8288 §3):
//
//	Link       = #link-value
//	link-value = "<" URI-Reference ">" *( OWS ";" OWS link-param )
//
// A "<" inside a quoted parameter value is not a target.
func rewriteLink(v string, k *keystore.Key, from *url.URL) string {
	var b strings.Builder
	quoted, escaped := false, false
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case quoted:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				quoted = false
			}
		case c == '"':
			quoted = true
		case c == '<':
			end := strings.IndexByte(v[i+1:], '>')
			if end < 0 {
				b.WriteString(v[i:])
				return b.String()
			}
			b.WriteByte('<')
			b.WriteString(rewriteRef(v[i+1:i+1+end], k, from))
			b.WriteByte('>')
			i += end + 1
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
