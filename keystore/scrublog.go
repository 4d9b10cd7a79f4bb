package keystore

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
)

// Scrubber returns the Scrubber of every credential the store holds: the
// keys' and the callers' tokens. Nil when there is none to look for.
func (s *contents) Scrubber() *Scrubber { return NewScrubber(s.secrets()...) }

// secrets are the credentials s holds.
func (s *contents) secrets() []string {
	var secrets []string
	for _, k := range s.keys {
		if k.Auth.Kind != AuthNone {
			secrets = append(secrets, k.secret.Reveal())
		}
	}
	for _, c := range s.callers {
		secrets = append(secrets, c.token.Reveal())
	}
	return secrets
}

// A ScrubHandler is a slog.Handler that removes credentials from every
// record before its inner handler sees it: the message and every
// attribute's value (strings, errors and anything else that prints). It
// is the last wall of the logs — the code that logs already scrubs what
// it knows may hold a credential. Until Use is called it passes records
// on unchanged. It is safe for concurrent use.
type ScrubHandler struct {
	inner slog.Handler
	s     *atomic.Pointer[Scrubber] // shared by the handlers WithAttrs and WithGroup derive
}

// NewScrubHandler returns a ScrubHandler in front of inner.
func NewScrubHandler(inner slog.Handler) *ScrubHandler {
	return &ScrubHandler{inner: inner, s: &atomic.Pointer[Scrubber]{}}
}

// Use makes h (and every handler derived from it) remove the credentials
// of store from now on.
func (h *ScrubHandler) Use(store *Store) { h.s.Store(store.Scrubber()) }

// Add makes h look for store's credentials besides those it looks for
// already: after a configuration is reloaded, a line about a call that
// began under the old one may still hold an old credential.
func (h *ScrubHandler) Add(store *Store) {
	for {
		old := h.s.Load()
		var secrets []string
		if old != nil {
			secrets = slices.Clone(old.secrets)
		}
		for _, v := range store.load().secrets() {
			if !slices.Contains(secrets, v) {
				secrets = append(secrets, v)
			}
		}
		if h.s.CompareAndSwap(old, NewScrubber(secrets...)) {
			return
		}
	}
}

func (h *ScrubHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *ScrubHandler) Handle(ctx context.Context, r slog.Record) error {
	s := h.s.Load()
	if s == nil {
		return h.inner.Handle(ctx, r)
	}
	msg, _ := s.Scrub(r.Message)
	out := slog.NewRecord(r.Time, r.Level, msg, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(scrubAttr(s, a))
		return true
	})
	return h.inner.Handle(ctx, out)
}

func (h *ScrubHandler) WithAttrs(as []slog.Attr) slog.Handler {
	if s := h.s.Load(); s != nil {
		clean := make([]slog.Attr, len(as))
		for i, a := range as {
			clean[i] = scrubAttr(s, a)
		}
		as = clean
	}
	return &ScrubHandler{inner: h.inner.WithAttrs(as), s: h.s}
}

func (h *ScrubHandler) WithGroup(name string) slog.Handler {
	return &ScrubHandler{inner: h.inner.WithGroup(name), s: h.s}
}

// scrubAttr returns a with the credentials removed from its value.
func scrubAttr(s *Scrubber, a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindGroup:
		g := v.Group()
		clean := make([]slog.Attr, len(g))
		for i, ga := range g {
			clean[i] = scrubAttr(s, ga)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(clean...)}
	case slog.KindString:
		if t, hit := s.Scrub(v.String()); hit {
			return slog.String(a.Key, t)
		}
		return slog.Attr{Key: a.Key, Value: v}
	case slog.KindAny:
		if t, hit := s.Scrub(fmt.Sprint(v.Any())); hit {
			return slog.String(a.Key, t)
		}
		return slog.Attr{Key: a.Key, Value: v}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
