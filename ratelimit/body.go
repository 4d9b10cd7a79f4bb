package ratelimit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
)

// A bodyDoc is a response body that is a JSON object. Only the members
// some reader needs are kept, raw, until that reader asks for one with the
// type it expects, so that a member of the wrong type is simply not there
// and a large body with many other members costs no allocations for them.
// (encoding/json matches member names case-insensitively.)
type bodyDoc struct {
	f bodyFields

	// RetryAfter is Discord's retry_after (float seconds), when it is a
	// number.
	RetryAfter *float64
}

type bodyFields struct {
	Type             json.RawMessage `json:"type"`
	Title            json.RawMessage `json:"title"`
	Status           json.RawMessage `json:"status"`
	Detail           json.RawMessage `json:"detail"`
	Code             json.RawMessage `json:"code"`
	Instance         json.RawMessage `json:"instance"`
	ViolatedPolicies json.RawMessage `json:"violated-policies"`
	Message          json.RawMessage `json:"message"`
	DocumentationURL json.RawMessage `json:"documentation_url"`
	RetryAfter       json.RawMessage `json:"retry_after"`
	Errors           json.RawMessage `json:"errors"`
	Extensions       json.RawMessage `json:"extensions"`
	Error            json.RawMessage `json:"error"`
	OK               json.RawMessage `json:"ok"`
}

// raw returns the member called name, or nil when it is absent.
func (d *bodyDoc) raw(name string) json.RawMessage {
	if d == nil {
		return nil
	}
	switch name {
	case "type":
		return d.f.Type
	case "title":
		return d.f.Title
	case "status":
		return d.f.Status
	case "detail":
		return d.f.Detail
	case "code":
		return d.f.Code
	case "instance":
		return d.f.Instance
	case "violated-policies":
		return d.f.ViolatedPolicies
	case "message":
		return d.f.Message
	case "documentation_url":
		return d.f.DocumentationURL
	case "retry_after":
		return d.f.RetryAfter
	case "errors":
		return d.f.Errors
	case "extensions":
		return d.f.Extensions
	case "error":
		return d.f.Error
	case "ok":
		return d.f.OK
	}
	return nil
}

// has reports whether member name is present (of any type).
func (d *bodyDoc) has(name string) bool {
	return d.raw(name) != nil
}

// readBody decodes the body (at most MaxBody bytes of it) when it is a
// JSON object. A body that is not JSON, or is a truncated prefix, leaves
// rd.doc nil; readers that need it then fall back to the headers.
func (rd *reader) readBody() {
	b := bytes.TrimSpace(rd.body)
	if len(b) == 0 || b[0] != '{' {
		return
	}
	var f bodyFields
	if json.Unmarshal(b, &f) != nil {
		return
	}
	rd.doc = &bodyDoc{f: f}
	if v, ok := rd.doc.number("retry_after"); ok {
		rd.doc.RetryAfter = &v
	}
}

// member decodes member name into v, reporting whether it is present and
// of v's type.
func (d *bodyDoc) member(name string, v any) bool {
	return unmarshalStrict(d.raw(name), v)
}

// unmarshalStrict decodes raw into v, refusing null (which encoding/json
// would accept for any type).
func unmarshalStrict(raw json.RawMessage, v any) bool {
	if len(raw) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return false
	}
	return json.Unmarshal(raw, v) == nil
}

func (d *bodyDoc) str(name string) (string, bool) {
	var s string
	return s, d.member(name, &s)
}

// integer returns member name when it is a JSON number with an integer
// value (not a string holding one).
func (d *bodyDoc) integer(name string) (int64, bool) {
	raw := bytes.TrimSpace(d.raw(name))
	if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
		return 0, false
	}
	var n json.Number
	if json.Unmarshal(raw, &n) != nil {
		return 0, false
	}
	i, err := n.Int64()
	return i, err == nil
}

// number returns member name when it is a JSON number.
func (d *bodyDoc) number(name string) (float64, bool) {
	var f float64
	ok := d.member(name, &f)
	return f, ok && !math.IsNaN(f) && !math.IsInf(f, 0)
}

// maxGraphQLErrors is how many GraphQL errors are looked at.
const maxGraphQLErrors = 16

// A graphQLError is the part of a GraphQL error object that reports
// throttling: GitHub's type "RATE_LIMITED", Shopify's extensions.code
// "THROTTLED".
type graphQLError struct {
	Type       string
	Extensions struct {
		Code string
	}
}

// graphQLErrors returns the first maxGraphQLErrors of the body's GraphQL
// errors:
//
//	{"errors": [{"type": "RATE_LIMITED", "message": "…"}]}
//	{"errors": [{"message": "Throttled", "extensions": {"code": "THROTTLED"}}]}
//
// An error of the wrong shape reads as empty.
func (d *bodyDoc) graphQLErrors() []graphQLError {
	raw := d.raw("errors")
	if len(raw) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('[') {
		return nil
	}
	var out []graphQLError
	for len(out) < maxGraphQLErrors && dec.More() {
		var e graphQLError
		var m json.RawMessage
		if dec.Decode(&m) != nil {
			break
		}
		if json.Unmarshal(m, &e) != nil {
			e = graphQLError{}
		}
		out = append(out, e)
	}
	return out
}

// readBodySignal reads the throttling a body reports: problem details
// and a google.rpc.Status's QuotaFailure under every profile, and what the profile's bodies say (profileTable's
// body: GraphQL errors, Slack's "ok": false).
func (rd *reader) readBodySignal() {
	rd.readProblem()
	rd.readGoogleQuota()
	if f := rd.row().body; f != nil {
		f(rd)
	}
}

// readGraphQLThrottle marks the reading Throttled when one of the body's
// GraphQL errors is a throttle by the profile's test.
func (rd *reader) readGraphQLThrottle(throttle func(graphQLError) bool) {
	for _, e := range rd.doc.graphQLErrors() {
		if throttle(e) {
			rd.r.Throttled = true
		}
	}
}

// readShopifyCost reads Shopify GraphQL's calculated query cost bucket:
//
//	{"extensions": {"cost": {"requestedQueryCost": 752, "throttleStatus":
//	  {"maximumAvailable": 1000.0, "currentlyAvailable": 988.0, "restoreRate": 50.0}}}}
//
// as a leaky bucket of points: Quota is the bucket size, Remaining what is
// available now (rounded down), and Window the time a drained bucket takes
// to refill at restoreRate points per second (rounded up), so that
// Quota/Window is the sustained rate. A THROTTLED answer says exactly
// when the query fits: after ceil((requested - available) / restoreRate)
// seconds, its wait.
func (rd *reader) readShopifyCost() {
	var ext struct {
		Cost struct {
			RequestedQueryCost json.RawMessage
			ThrottleStatus     struct {
				MaximumAvailable, CurrentlyAvailable, RestoreRate json.RawMessage
			}
		}
	}
	if !rd.doc.member("extensions", &ext) {
		return
	}
	status := ext.Cost.ThrottleStatus
	if status.MaximumAvailable == nil && status.CurrentlyAvailable == nil {
		return
	}
	num := func(raw json.RawMessage) (float64, bool) {
		var f float64
		ok := unmarshalStrict(raw, &f)
		return f, ok && f >= 0 && f <= 1e15
	}
	o := Observation{Policy: "graphql", Unit: Points, Shape: ShapeBody, Profile: Shopify}
	maxAvail, okMax := num(status.MaximumAvailable)
	if okMax {
		o.Quota, o.HasQuota = int64(maxAvail), true
	}
	cur, okCur := num(status.CurrentlyAvailable)
	if okCur {
		o.Remaining, o.HasRemaining = int64(cur), true
	}
	rate, okRate := num(status.RestoreRate)
	if okRate && okMax && rate > 0 {
		o.Window, _ = floatSeconds(math.Ceil(maxAvail / rate))
	}
	if req, ok := num(ext.Cost.RequestedQueryCost); ok && rd.r.Throttled && okCur && okRate && rate > 0 && req > cur {
		d, _ := floatSeconds(math.Ceil((req - cur) / rate))
		w := capWait(d, "body extensions.cost", fmt.Sprint(req))
		rd.applyWait(w)
		rd.warnf("body extensions.cost: the query costs %v points, %v are available and %v restore per second: it fits in %v", req, cur, rate, w.d)
	}
	if !o.HasQuota && !o.HasRemaining {
		rd.warnf("body extensions.cost.throttleStatus: no usable numbers, ignored")
		return
	}
	rd.add(o, false)
}
