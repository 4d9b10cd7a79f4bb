package ratelimit

import (
	"net/http"
	"time"
)

// ReplaceRetryAfter replaces whatever Retry-After an upstream sent in h
// (valid or not) with what mcp-quota decided: d in delay-seconds, rounded
// up, when d > 0, and no Retry-After at all otherwise. An intermediary
// passes on its own decision, never a value it could not read.
func ReplaceRetryAfter(h http.Header, d time.Duration) {
	h.Del("Retry-After")
	if d > 0 {
		SetRetryAfter(h, d)
	}
}
