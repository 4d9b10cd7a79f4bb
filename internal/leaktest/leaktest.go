// Package leaktest finds a credential in what mcp-quota wrote or sent, in
// every form it can leak in, for the tests of the walls. It does not use
// keystore.Scrubber, whose work it checks: each form is written out by
// the standard library and looked for by plain substring search.
package leaktest

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
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
// secret in any of its Forms, quoting where — also inside every gzip or
// zlib stream a channel holds, decoded (see Decoded).
func Scan(t testing.TB, secret string, channels map[string]string) {
	t.Helper()
	all := map[string]string{}
	for name, text := range channels {
		all[name] = text
		for where, d := range Decoded(text) {
			all[name+", "+where+" decoded"] = d
		}
	}
	for name, text := range all {
		for form, v := range Forms(secret) {
			if i := strings.Index(text, v); i >= 0 {
				t.Errorf("%s holds the credential (%s): …%s…", name, form, text[max(i-160, 0):min(i+len(v)+40, len(text))])
			}
		}
	}
}

// Decoded finds the compressed streams text holds — gzip members, zlib
// streams, and raw deflate (tried where a gzip or zlib stream would
// begin, and at the start) — and returns each one's decoded bytes (at
// most 64 MiB of each) by where it starts. Bytes that only look like the
// start of a stream decode to nothing and are left out.
func Decoded(text string) map[string]string {
	out := map[string]string{}
	b := []byte(text)
	try := func(where string, r io.Reader, err error) {
		if err != nil {
			return
		}
		d, _ := io.ReadAll(io.LimitReader(r, 64<<20))
		if len(d) > 0 {
			out[where] = string(d)
		}
	}
	for i := 0; i+2 <= len(b); i++ {
		switch {
		case b[i] == 0x1f && b[i+1] == 0x8b:
			z, err := gzip.NewReader(bytes.NewReader(b[i:]))
			try(fmt.Sprintf("gzip at byte %d", i), z, err)
		case b[i]&0x0f == 8 && (uint16(b[i])<<8|uint16(b[i+1]))%31 == 0:
			z, err := zlib.NewReader(bytes.NewReader(b[i:]))
			try(fmt.Sprintf("zlib at byte %d", i), z, err)
		}
	}
	if len(b) > 0 {
		try("raw deflate at byte 0", flate.NewReader(bytes.NewReader(b)), nil)
	}
	return out
}

// StateFiles are every file mcp-quota writes for the SQLite state at path,
// by name, for Scan: the state file, its write-ahead log and shared
// memory (when they exist), and the journals of outcomes beside it. It
// fails t when the state file cannot be read.
func StateFiles(t testing.TB, path string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, suffix := range []string{"", "-wal", "-shm"} {
		b, err := os.ReadFile(path + suffix)
		if err != nil && suffix == "" {
			t.Fatalf("reading the state file: %v", err)
		}
		if err == nil {
			out["state file"+suffix] = string(b)
		}
	}
	journals, _ := filepath.Glob(path + ".outcomes/*")
	for _, name := range journals {
		b, _ := os.ReadFile(name)
		out["journal "+filepath.Base(name)] = string(b)
	}
	return out
}
