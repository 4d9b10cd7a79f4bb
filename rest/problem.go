package rest

import (
	"net/http"
	"strconv"

	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/ratelimit"
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
	// CodeShareSpent is a refusal for the caller's principal alone (429):
	// it has used its share of the key's window, or principals further
	// behind wait for their turn. The key itself is not spent.
	CodeShareSpent = "shareSpent"
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

// A refusal is mcp-quota's own refusal of a call on a key, to be said in
// the dialect of the key's profile (see writeRefusal).
type refusal struct {
	status    int
	detail    string
	secondary bool          // a wait that holds no spent quota (a gate), not an exhausted budget
	code      string        // the problem's code; "" is CodeRateLimited
	binding   *pacer.Budget // the budget that binds, when one does
}

// A dialect is how a vendor refuses a call for its rate limits: the
// members its SDKs read in the body (beside the RFC 9457 members, as
// extension members) and the media type they still parse. A nil members
// adds none; an empty mediaType keeps application/problem+json; a zero
// status keeps 429.
type dialect struct {
	status    int
	mediaType string
	members   func(r refusal) map[string]any
}

// GitHub's documentation pages its SDKs recognise a refusal's kind by
// (go-github by the suffix, octokit by the message's words).
const (
	githubPrimaryDoc   = "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-primary-rate-limits"
	githubSecondaryDoc = "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"
)

// dialects holds, per profile, how its vendor's SDKs expect a rate-limit
// refusal to look. A profile without a row refuses with a plain problem.
var dialects = map[ratelimit.Profile]dialect{
	// @octokit/request parses only application/json bodies; go-github
	// any. go-github reads a rate limit only from a 403 (octokit from a
	// 403 or a 429). octokit's throttling plugin tells a secondary limit
	// by the words "secondary rate" in message, go-github by
	// documentation_url.
	ratelimit.GitHub: {status: http.StatusForbidden, mediaType: "application/json", members: func(r refusal) map[string]any {
		if r.secondary {
			return map[string]any{"message": "You have exceeded a secondary rate limit. " + r.detail, "documentation_url": githubSecondaryDoc}
		}
		return map[string]any{"message": "API rate limit exceeded. " + r.detail, "documentation_url": githubPrimaryDoc}
	}},
	// The OpenAI SDKs parse any JSON body and read its error object.
	ratelimit.OpenAI: {members: func(r refusal) map[string]any {
		kind := "requests"
		if r.binding != nil && r.binding.Unit != "" && r.binding.Unit != ratelimit.Requests {
			kind = "tokens"
		}
		return map[string]any{"error": map[string]any{"message": r.detail, "type": kind, "param": nil, "code": "rate_limit_exceeded"}}
	}},
	// The Anthropic SDKs parse any JSON body and read its error object.
	ratelimit.Anthropic: {members: func(r refusal) map[string]any {
		return map[string]any{"error": map[string]any{"type": "rate_limit_error", "message": r.detail}}
	}},
	// discord.js and discord.py parse application/json only.
	ratelimit.Discord: {mediaType: "application/json", members: func(r refusal) map[string]any {
		return map[string]any{"message": "You are being rate limited.", "global": false}
	}},
	ratelimit.GitLab: {mediaType: "application/json", members: func(r refusal) map[string]any {
		return map[string]any{"message": "Retry later"}
	}},
	ratelimit.Shopify: {mediaType: "application/json", members: func(r refusal) map[string]any {
		return map[string]any{"errors": "Exceeded the rate limit. " + r.detail}
	}},
}

// writeRefusal answers with mcp-quota's own rate-limit refusal r: an
// RFC 9457 problem with the stable code "rateLimited" and members ext,
// carrying the members the key's vendor's SDKs read (see dialects), in a
// media type they parse.
func writeRefusal(w http.ResponseWriter, p ratelimit.Profile, r refusal, ext map[string]any) {
	d := dialects[p]
	if d.status != 0 {
		r.status = d.status
	}
	body := map[string]any{}
	if d.members != nil {
		for k, v := range d.members(r) {
			body[k] = v
		}
	}
	if p == ratelimit.Discord {
		if s, err := strconv.ParseFloat(w.Header().Get("Retry-After"), 64); err == nil {
			body["retry_after"] = s
		}
	}
	for k, v := range ext {
		body[k] = v
	}
	code := r.code
	if code == "" {
		code = CodeRateLimited
	}
	prob := map[string]any{"status": r.status, "title": http.StatusText(r.status), "code": code, "detail": r.detail}
	for k, v := range body {
		if _, ok := prob[k]; !ok {
			prob[k] = v
		}
	}
	if _, ok := prob["type"]; !ok {
		prob["type"] = "about:blank"
	}
	mt := d.mediaType
	if mt == "" {
		mt = "application/problem+json"
	}
	writeBody(w, r.status, mt, prob)
}

// refusalCode is the problem code of a pause: CodeShareSpent when it
// concerns the caller's principal alone (pacer.ShareLimit or TurnLimit;
// never a policy, whatever its name).
func refusalCode(pe *pacer.PauseError) string {
	if pe.Limit == pacer.ShareLimit || pe.Limit == pacer.TurnLimit {
		return CodeShareSpent
	}
	return CodeRateLimited
}

// waitOnly reports whether a pause holds no spent quota: a wait the
// upstream asked for, a backoff, an open circuit — not a budget used up
// or paced, whatever its policy is named.
func waitOnly(pe *pacer.PauseError) bool {
	if pe.Gate == "" {
		return false
	}
	return pe.Binding == nil || pe.Binding.Hidden || pe.Binding.Remaining != 0
}

// secondaryRefusal reports whether an upstream's answer refused the call
// while none of its counts was spent (GitHub's secondary limits): its
// wait then holds no quota, and its counts pass as they came.
func secondaryRefusal(rd *ratelimit.Reading) bool {
	if rd == nil || !rd.Throttled {
		return false
	}
	for _, o := range rd.Observations {
		if o.HasRemaining && o.Remaining == 0 {
			return false
		}
	}
	return true
}
