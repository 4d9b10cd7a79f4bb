package telemetry

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/mark3labs/mcp-go/tracing"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// MCP adds tracing to an MCP server: hooks go into hooks, and the options
// returned install the tracer and the propagators (from the HTTP
// traceparent field, and from the request's _meta as the 2026-07-28
// revision carries it; _meta wins when both are there). network is the
// transport's network.transport ("tcp", or "pipe" for stdio). Off, it
// adds nothing.
func (t *Tracing) MCP(network string) func(hooks *server.Hooks) []server.ServerOption {
	if t == nil {
		return nil
	}
	return func(hooks *server.Hooks) []server.ServerOption {
		hooks.AddBeforeAny(func(ctx context.Context, id any, _ mcp.MCPMethod, _ any) {
			if s, ok := tracing.SpanFromContext(ctx).(*mcpSpan); ok {
				if v := requestID(id); v != "" {
					s.span.SetAttributes(attribute.String("jsonrpc.request.id", v))
				}
			}
		})
		hooks.AddOnError(func(ctx context.Context, _ any, _ mcp.MCPMethod, _ any, err error) {
			var re interface{ ToJSONRPCError() mcp.JSONRPCError }
			if s, ok := tracing.SpanFromContext(ctx).(*mcpSpan); ok && errors.As(err, &re) {
				s.setError(strconv.Itoa(re.ToJSONRPCError().Error.Code))
			}
		})
		return []server.ServerOption{
			server.WithTracer(mcpTracer{t: t, network: network}),
			server.WithPropagator(headerPropagator{t.prop}),
			server.WithMetaPropagator(metaPropagator{t.prop}),
		}
	}
}

// requestID is a JSON-RPC id as the client wrote it.
func requestID(id any) string {
	if r, ok := id.(mcp.RequestId); ok {
		id = r.Value()
	}
	switch v := id.(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case int64:
		return strconv.FormatInt(v, 10)
	case int:
		return strconv.Itoa(v)
	}
	return ""
}

// mcpTracer is mcp-go's tracer over OpenTelemetry, with the names of the
// semantic conventions for MCP: mcp-go opens a server span per message
// ("mcp.<method>") and an internal one per tool handler; the first
// becomes "{mcp.method.name} {target}", the second is not kept (the tool
// is the server span's target).
type mcpTracer struct {
	t       *Tracing
	network string
}

func (m mcpTracer) Start(ctx context.Context, name string, kind tracing.SpanKind, attrs ...tracing.Attribute) (context.Context, tracing.Span) {
	if kind != tracing.SpanKindServer {
		return ctx, tracing.SpanFromContext(ctx) // the tool handler's: the server span stands for it
	}
	method := name
	if len(method) > 4 && method[:4] == "mcp." {
		method = method[4:]
	}
	ctx, span := m.t.tracer.Start(ctx, method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("mcp.method.name", method), attribute.String("network.transport", m.network)))
	s := &mcpSpan{span: span, method: method}
	s.SetAttributes(attrs...)
	return tracing.ContextWithSpan(ctx, s), s
}

// mcpSpan maps mcp-go's span calls to the conventions' attributes.
type mcpSpan struct {
	span   trace.Span
	method string

	mu      sync.Mutex
	errType string
}

func (s *mcpSpan) SetAttributes(attrs ...tracing.Attribute) {
	for _, a := range attrs {
		switch a.Key {
		case "mcp.tool.name":
			s.span.SetName(s.method + " " + a.Value)
			s.span.SetAttributes(attribute.String("gen_ai.tool.name", a.Value),
				attribute.String("gen_ai.operation.name", "execute_tool"))
		case "mcp.session.id", "mcp.protocol.version":
			s.span.SetAttributes(attribute.String(a.Key, a.Value))
		}
	}
}

// RecordError keeps the error's kind only: its text may quote what the
// caller sent.
func (s *mcpSpan) RecordError(error) { s.setError("_OTHER") }

// SetStatus marks the span failed. The description is not kept (a
// JSON-RPC error's message may quote the request); a tool's error result
// is error.type "tool_error", as the conventions say.
func (s *mcpSpan) SetStatus(code tracing.StatusCode, description string) {
	if code != tracing.StatusError {
		return
	}
	if description == "tool returned error result" {
		s.setError("tool_error")
		return
	}
	s.setError("_OTHER")
}

func (s *mcpSpan) setError(kind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.errType != "" {
		return // the first, most specific, stands
	}
	s.errType = kind
	s.span.SetStatus(codes.Error, "")
	s.span.SetAttributes(attribute.String("error.type", kind))
}

func (s *mcpSpan) End() { s.span.End() }

// headerPropagator takes the trace context from the HTTP request's
// traceparent and tracestate, unless the request's _meta gave one.
type headerPropagator struct{ p propagation.TextMapPropagator }

func (h headerPropagator) Inject(ctx context.Context, headers http.Header) {
	h.p.Inject(ctx, propagation.HeaderCarrier(headers))
}

func (h headerPropagator) Extract(ctx context.Context, headers http.Header) context.Context {
	if headers == nil || trace.SpanContextFromContext(ctx).IsRemote() {
		return ctx
	}
	return h.p.Extract(ctx, propagation.HeaderCarrier(headers))
}

// metaPropagator takes the trace context from the request's _meta
// (traceparent, tracestate).
type metaPropagator struct{ p propagation.TextMapPropagator }

func (m metaPropagator) InjectMeta(ctx context.Context, meta *mcp.Meta) *mcp.Meta {
	if meta == nil {
		meta = &mcp.Meta{}
	}
	c := propagation.MapCarrier{}
	m.p.Inject(ctx, c)
	if len(c) > 0 && meta.AdditionalFields == nil {
		meta.AdditionalFields = map[string]any{}
	}
	for k, v := range c {
		meta.AdditionalFields[k] = v
	}
	return meta
}

func (m metaPropagator) ExtractMeta(ctx context.Context, meta *mcp.Meta) context.Context {
	if meta == nil {
		return ctx
	}
	c := propagation.MapCarrier{}
	for _, k := range []string{"traceparent", "tracestate"} {
		if v, ok := meta.AdditionalFields[k].(string); ok {
			c[k] = v
		}
	}
	if c["traceparent"] == "" {
		return ctx
	}
	return m.p.Extract(ctx, c)
}
