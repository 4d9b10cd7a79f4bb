package demo

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
)

// problem is an RFC 9457 problem in the reference API's shape: status, a stable
// code, and a sentence to act on.
type problem struct {
	Status int    `json:"status"`
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

func writeProblem(w http.ResponseWriter, status int, code, detail string) {
	body, err := json.Marshal(problem{Status: status, Code: code, Detail: detail})
	if err != nil {
		panic(err) // a problem always marshals
	}
	setContentType(w.Header(), "application/problem+json")
	w.WriteHeader(status)
	w.Write(body)
}

// writeJSON writes v as a JSON answer with status, without an ETag.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		panic(err) // every answer type marshals
	}
	setContentType(w.Header(), "application/json; charset=utf-8")
	w.WriteHeader(status)
	w.Write(body)
}

func writeText(w http.ResponseWriter, status int, text string) {
	setContentType(w.Header(), "text/plain; charset=utf-8")
	w.WriteHeader(status)
	w.Write([]byte(text))
}

// writeRepresentation answers a GET or HEAD with 200 and the JSON body,
// under a strong ETag computed from tagged (the body itself when nil),
// or with 304 Not Modified and no body if the request's If-None-Match
// names that tag.
func writeRepresentation(w http.ResponseWriter, r *http.Request, body, tagged []byte) {
	if tagged == nil {
		tagged = body
	}
	sum := sha256.Sum256(tagged)
	tag := hex.EncodeToString(sum[:16])
	setETag(w.Header(), tag)
	if noneMatch(r.Header.Get("If-None-Match"), tag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	setContentType(w.Header(), "application/json; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(body)
	}
}

// noneMatch reports whether an If-None-Match field value matches the
// entity tag tag (unquoted) by weak comparison (RFC 9110 §13.1.2):
//
//	If-None-Match = "*" / #entity-tag
func noneMatch(field, tag string) bool {
	for part := range strings.SplitSeq(field, ",") {
		part = strings.TrimSpace(part)
		if part == "*" {
			return true
		}
		if strings.TrimPrefix(part, "W/") == `"`+tag+`"` {
			return true
		}
	}
	return false
}
