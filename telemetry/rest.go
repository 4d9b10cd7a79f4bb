package telemetry

import (
	"net/http"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// REST wraps the HTTP handler: each REST call (/k/{key}/…, /v1/…) gets
// a server span named by its method and route, its trace context taken
// from the traceparent field. isKey says whether a name is a configured
// key's: only such a name is kept on the span (the path is not: its
// query may hold anything). Other paths (MCP, the page) pass untouched;
// off, h is returned as it is.
func (t *Tracing) REST(h http.Handler, isKey func(string) bool) http.Handler {
	if t == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		route, key := restRoute(r.URL.Path)
		if route == "" {
			h.ServeHTTP(w, r)
			return
		}
		method := httpMethod(r.Method)
		attrs := []attribute.KeyValue{attribute.String("http.request.method", method), attribute.String("http.route", route),
			attribute.String("url.scheme", scheme(r))}
		if key != "" && isKey != nil && isKey(key) {
			attrs = append(attrs, attribute.String("mcp_quota.key", key))
		}
		ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := t.tracer.Start(ctx, method+" "+route, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r.WithContext(ctx))
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		span.SetAttributes(attribute.Int("http.response.status_code", status))
		if status >= 500 {
			span.SetStatus(codes.Error, "")
			span.SetAttributes(attribute.String("error.type", strconv.Itoa(status)))
		}
	})
}

// restRoute is the route of a REST path, and the key it names; "" for
// a path that is not the REST side's.
func restRoute(path string) (route, key string) {
	switch {
	case strings.HasPrefix(path, "/k/"):
		key, _, _ = strings.Cut(strings.TrimPrefix(path, "/k/"), "/")
		return "/k/{key}/{path}", key
	case path == "/v1/quota" || path == "/v1/activity":
		return path, ""
	case strings.HasPrefix(path, "/v1/"):
		return "/v1/{path}", ""
	}
	return "", ""
}

func scheme(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	return "http"
}

// statusWriter notes the status a handler answered with. Unwrap lets
// http.ResponseController reach the writer it wraps (flushes, deadlines).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
