package rest

import (
	"net/http"
)

// Stable problem codes of the REST side (the "code" member of every
// RFC 9457 problem it answers with).
const (
	CodeUnauthorized        = "unauthorized"
	CodeForbidden           = "forbidden"
	CodeUnknownKey          = "unknownKey"
	CodeRateLimited         = "rateLimited"
	CodeUpstreamUnavailable = "upstreamUnavailable"
	CodeBadRequest          = "badRequest"
	CodePayloadTooLarge     = "payloadTooLarge"
	CodeInternal            = "internal"
	// CodeStateUnavailable is mcp-quota's own state file failing (503):
	// nothing can be admitted or recorded until it is back.
	CodeStateUnavailable = "stateUnavailable"
)

// WriteProblem answers with an RFC 9457 problem: status, a stable code, a
// detail sentence, and extension members ext (which may set "type").
func WriteProblem(w http.ResponseWriter, status int, code, detail string, ext map[string]any) {
	p := map[string]any{"status": status, "title": http.StatusText(status), "code": code, "detail": detail}
	for k, v := range ext {
		p[k] = v
	}
	if _, ok := p["type"]; !ok {
		p["type"] = "about:blank"
	}
	writeBody(w, status, "application/problem+json", p)
}

func writeProblem(w http.ResponseWriter, status int, code, detail string, ext map[string]any) {
	WriteProblem(w, status, code, detail, ext)
}
