package telemetry

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// Watch is the upstream client's Watch hook (nil when tracing is off):
// under the span of the MCP request or REST call, each attempt becomes a
// "wait for budget" span (how long, and what held it) and a client span
// for the attempt (its status and the rate-limit fields read), drawn
// after the fact from the durations the event reports; a call's end
// names its key, call ID and final state on the enclosing span.
func (t *Tracing) Watch() func(context.Context, upstream.Event) {
	if t == nil {
		return nil
	}
	return t.watch
}

func (t *Tracing) watch(ctx context.Context, e upstream.Event) {
	now := time.Now()
	key := attribute.String("mcp_quota.key", e.Key)
	switch e.Kind {
	case upstream.Refused:
		t.waitSpan(ctx, now.Add(-e.Wait), now, e.Source, key, attribute.Int("mcp_quota.attempt", e.Attempt),
			attribute.String("error.type", "rejected_local"))
	case upstream.Attempted:
		sent := now.Add(-e.Latency)
		if e.Wait > 0 {
			t.waitSpan(ctx, sent.Add(-e.Wait), sent, e.HeldBy, key, attribute.Int("mcp_quota.attempt", e.Attempt))
		}
		t.attemptSpan(ctx, sent, now, e, key)
	case upstream.Ended:
		trace.SpanFromContext(ctx).SetAttributes(key, attribute.String("mcp_quota.call.id", e.CallID),
			attribute.String("mcp_quota.call.state", e.State), attribute.Int("mcp_quota.call.attempts", e.Attempt))
	}
}

func (t *Tracing) waitSpan(ctx context.Context, start, end time.Time, heldBy string, attrs ...attribute.KeyValue) {
	if heldBy != "" {
		attrs = append(attrs, attribute.String("mcp_quota.wait.held_by", heldBy))
	}
	attrs = append(attrs, attribute.Float64("mcp_quota.wait.seconds", end.Sub(start).Seconds()))
	_, s := t.tracer.Start(ctx, "wait for budget", trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	for _, a := range attrs {
		if a.Key == "error.type" {
			s.SetStatus(codes.Error, "")
		}
	}
	s.End(trace.WithTimestamp(end))
}

func (t *Tracing) attemptSpan(ctx context.Context, start, end time.Time, e upstream.Event, key attribute.KeyValue) {
	attrs := []attribute.KeyValue{key, attribute.String("http.request.method", httpMethod(e.Method)),
		attribute.String("mcp_quota.target", e.Target), attribute.Int("mcp_quota.attempt", e.Attempt),
		attribute.String("mcp_quota.attempt.state", e.State)}
	failed := ""
	if e.Status > 0 {
		attrs = append(attrs, attribute.Int("http.response.status_code", e.Status))
		if e.Status >= 400 {
			failed = strconv.Itoa(e.Status)
		}
	} else {
		failed = e.State
	}
	if e.Reading != nil {
		attrs = append(attrs, readingAttrs(*e.Reading)...)
	}
	if failed != "" {
		attrs = append(attrs, attribute.String("error.type", failed))
	}
	_, s := t.tracer.Start(ctx, httpMethod(e.Method), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	if failed != "" {
		s.SetStatus(codes.Error, "")
	}
	s.End(trace.WithTimestamp(end))
}

// readingAttrs are the rate-limit fields an answer carried: those of the
// observation closest to exhaustion (the least remaining), and the
// server's Retry-After.
func readingAttrs(r ratelimit.Reading) []attribute.KeyValue {
	var out []attribute.KeyValue
	var tight *ratelimit.Observation
	for i, o := range r.Observations {
		if o.HasRemaining && (tight == nil || !tight.HasRemaining || o.Remaining < tight.Remaining) {
			tight = &r.Observations[i]
		} else if tight == nil {
			tight = &r.Observations[i]
		}
	}
	if tight != nil {
		out = append(out, attribute.String("mcp_quota.ratelimit.policy", tight.Policy))
		if tight.HasQuota {
			out = append(out, attribute.Int64("mcp_quota.ratelimit.quota", tight.Quota))
		}
		if tight.HasRemaining {
			out = append(out, attribute.Int64("mcp_quota.ratelimit.remaining", tight.Remaining))
		}
		if tight.HasReset {
			out = append(out, attribute.Float64("mcp_quota.ratelimit.reset", tight.Reset.Seconds()))
		}
	}
	if r.HasRetryAfter {
		out = append(out, attribute.Float64("mcp_quota.ratelimit.retry_after", r.RetryAfter.Seconds()))
	}
	return out
}

// httpMethod is the method as the HTTP conventions name it: a method
// they do not know is _OTHER.
func httpMethod(m string) string {
	switch m {
	case "":
		return http.MethodGet
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete,
		http.MethodOptions, http.MethodConnect, http.MethodTrace, "QUERY":
		return m
	}
	return "_OTHER"
}
