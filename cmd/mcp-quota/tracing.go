package main

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/telemetry"
)

// tracing sets up the OpenTelemetry traces the OTEL_* variables ask for
// (nil when they leave them off), and returns what ends them: it sends
// the spans not yet sent.
func (e environment) tracing(ctx context.Context, log *slog.Logger) (*telemetry.Tracing, func(), error) {
	t, err := telemetry.FromEnv(ctx, e.getenv, version)
	if err != nil || t == nil {
		return nil, func() {}, err
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("exporting traces failed", "error", err)
	}))
	log.Info("exporting traces over OTLP/HTTP")
	return t, func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := t.Shutdown(ctx); err != nil {
			log.Warn("sending the last traces failed", "error", err)
		}
	}, nil
}

// isKey reports whether keys configures a key of that name.
func isKey(keys *keystore.Store) func(string) bool {
	return func(name string) bool {
		_, err := keys.Key(name)
		return err == nil
	}
}
