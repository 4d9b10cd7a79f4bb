package telemetry

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// TestFromEnv: tracing is off unless the OTEL_* variables turn it on,
// and a setting mcp-quota cannot honour is refused, not ignored.
func TestFromEnv(t *testing.T) {
	const endpoint = "http://127.0.0.1:4318"
	for _, tc := range []struct {
		name    string
		env     map[string]string
		on      bool
		wantErr string
	}{
		{name: "nothing set", env: nil},
		{name: "exporter none", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}},
		{name: "sdk disabled", env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}},
		{name: "endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}, on: true},
		{name: "traces endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint + "/v1/traces"}, on: true},
		{name: "exporter otlp", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, on: true},
		{name: "http/protobuf", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, on: true},
		{name: "grpc", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, wantErr: "http/protobuf only"},
		{name: "traces grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, wantErr: "http/protobuf only"},
		{name: "endpoint without a scheme", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, wantErr: "OTEL_EXPORTER_OTLP_ENDPOINT is not an http:// or https:// URL"},
		{name: "zipkin", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: "otlp (over HTTP) only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := FromEnv(context.Background(), env(tc.env), "test")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := tr != nil; got != tc.on {
				t.Fatalf("tracing on: got %v, want %v", got, tc.on)
			}
			if err := tr.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

type handler struct{ name string }

func (handler) ServeHTTP(http.ResponseWriter, *http.Request) {}

// TestOffCostsNothing: with tracing off, nothing is wrapped or hooked.
func TestOffCostsNothing(t *testing.T) {
	var tr *Tracing
	h := handler{"the gateway"}
	if got := tr.REST(h, nil); got != http.Handler(h) {
		t.Errorf("REST wrapped the handler: got %T, want it as it was", got)
	}
	if tr.Watch() != nil || tr.MCP("tcp") != nil {
		t.Error("off, Watch and MCP must be nil: no hook at all")
	}
}
