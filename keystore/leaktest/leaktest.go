// Package leaktest finds a credential in what mcp-quota wrote or sent, in
// every form it can leak in, for the tests of the walls. It does not use
// keystore.Scrubber, whose work it checks: each form is written out by
// the standard library and looked for by plain substring search.
package leaktest

import (
	"encoding/base64"
	"encoding/json"
	"net/url"
	"strings"
	"testing"
)

// Forms are the ways secret is written where it leaks — a query or path,
// either case of percent-encoding, JSON (as Go escapes it, and escaped
// once more inside an MCP result's text), base64 — by the name of each.
func Forms(secret string) map[string]string {
	j, _ := json.Marshal(secret)
	inJSON := strings.Trim(string(j), `"`)
	return map[string]string{
		"raw":               secret,
		"percent-encoded":   url.QueryEscape(secret),
		"percent, lower":    lowerHex(url.QueryEscape(secret)),
		"path-escaped":      url.PathEscape(secret),
		"json":              inJSON,
		"json-escaped, MCP": strings.ReplaceAll(inJSON, `\u0026`, `\\u0026`),
		"base64":            base64.StdEncoding.EncodeToString([]byte(secret)),
		"base64url":         base64.RawURLEncoding.EncodeToString([]byte(secret)),
	}
}

// lowerHex writes s's percent-encodings in lower case.
func lowerHex(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			b.WriteString("%" + strings.ToLower(s[i+1:i+3]))
			i += 2
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Scan fails t for every channel (a name and what it held) that holds
// secret in any of its Forms, quoting where.
func Scan(t testing.TB, secret string, channels map[string]string) {
	t.Helper()
	for name, text := range channels {
		for form, v := range Forms(secret) {
			if i := strings.Index(text, v); i >= 0 {
				t.Errorf("%s holds the credential (%s): …%s…", name, form, text[max(i-160, 0):min(i+len(v)+40, len(text))])
			}
		}
	}
}
