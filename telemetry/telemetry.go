// Package telemetry exports OpenTelemetry traces of mcp-quota's calls:
// a span per MCP request and per REST call, following the semantic
// conventions for MCP and HTTP, with child spans for each attempt's wait
// for the budget and for each upstream attempt. It hangs off the seams
// the rest of the program already has — mcp-go's tracer, propagators
// and hooks, the upstream client's Watch hook, and a middleware around
// the HTTP handler — and is off unless the standard OTEL_* environment
// variables turn it on.
//
// No attribute holds a credential, a caller's token, a query string or
// a body: keys are named by their configured names and upstream targets
// as the activity shows them.
package telemetry

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Tracing exports spans to an OTLP/HTTP receiver. A nil *Tracing is
// tracing turned off: every method is a no-op that costs nothing (no
// exporter, no tracer, no wrapper). It is safe for concurrent use.
type Tracing struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
}

// scope is the instrumentation scope's name.
const scope = "github.com/mcp-quota/mcp-quota/telemetry"

// FromEnv sets tracing up as the standard OTEL_* variables (read through
// getenv) say, or returns nil when they leave it off:
//
//   - OTEL_SDK_DISABLED=true, or OTEL_TRACES_EXPORTER=none: off;
//   - OTEL_TRACES_EXPORTER=otlp, or unset with OTEL_EXPORTER_OTLP_ENDPOINT
//     or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set: on, over OTLP/HTTP
//     (protobuf); any other exporter or protocol is refused;
//   - OTEL_SERVICE_NAME names the service (default "mcp-quota").
//
// The exporter reads its other settings (OTEL_EXPORTER_OTLP_HEADERS,
// _TIMEOUT, _COMPRESSION, _CERTIFICATE…) and the SDK its sampler and
// batching (OTEL_TRACES_SAMPLER, OTEL_BSP_*) from the process's
// environment, as every OpenTelemetry SDK does. Nothing is sent until a
// span ends; Shutdown sends what is left.
func FromEnv(ctx context.Context, getenv func(string) string, version string) (*Tracing, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, nil
	}
	endpoint, from := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	if endpoint == "" {
		if base := getenv("OTEL_EXPORTER_OTLP_ENDPOINT"); base != "" {
			endpoint, from = strings.TrimRight(base, "/")+"/v1/traces", "OTEL_EXPORTER_OTLP_ENDPOINT" // the base URL's signal path
		}
	}
	if endpoint != "" {
		if u, err := url.Parse(endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%s is not an http:// or https:// URL: give the receiver's URL, such as http://collector:4318", from)
		}
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return nil, nil
	case "":
		if endpoint == "" {
			return nil, nil // off by default
		}
	case "otlp":
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER %q: mcp-quota exports traces with otlp (over HTTP) only; set otlp or none", exp)
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := strings.TrimSpace(getenv(name)); p != "" {
			if p != "http/protobuf" {
				return nil, fmt.Errorf("%s %q: mcp-quota exports traces over http/protobuf only", name, p)
			}
			break
		}
	}
	var opts []otlptracehttp.Option
	if endpoint != "" {
		opts = append(opts, otlptracehttp.WithEndpointURL(endpoint))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("the OTLP trace exporter: %w", err)
	}
	service := getenv("OTEL_SERVICE_NAME")
	if service == "" {
		service = "mcp-quota"
	}
	res := resource.NewSchemaless(attribute.String("service.name", service), attribute.String("service.version", version))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracing{provider: tp, tracer: tp.Tracer(scope, trace.WithInstrumentationVersion(version)),
		prop: propagation.TraceContext{}}, nil
}

// Shutdown exports the spans not yet sent and stops the exporter.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}
