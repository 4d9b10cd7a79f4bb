package oauth

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// introspected is a cached introspection: the principal (nil for an
// inactive token) until when it may be used.
type introspected struct {
	p     *Principal
	until time.Time
}

// introspection is RFC 7662's answer.
type introspection struct {
	Active   bool            `json:"active"`
	Scope    string          `json:"scope"`
	ClientID string          `json:"client_id"`
	Sub      string          `json:"sub"`
	Exp      int64           `json:"exp"`
	Nbf      int64           `json:"nbf"`
	Iss      string          `json:"iss"`
	Aud      json.RawMessage `json:"aud"`
}

// introspect asks the issuers' introspection endpoints about an opaque
// token, in the order they are configured, and keeps the answer for
// IntrospectionCache but never past the token's exp (an inactive answer
// for IntrospectionCache, so a stream of bad tokens costs the issuer
// little). A token revoked at the issuer is refused at the latest
// IntrospectionCache later.
func (s *Server) introspect(ctx context.Context, token string) (*Principal, error) {
	if s.c.IntrospectionClient == "" {
		return nil, invalid("opaque tokens are not accepted here (no introspection is configured): send a JWT access token")
	}
	if token == "" {
		return nil, invalid("the token is empty")
	}
	digest := sha256.Sum256([]byte(token))
	now := s.c.Clock.Now()
	s.introMu.Lock()
	c, ok := s.intro[digest]
	if ok && !now.Before(c.until) {
		delete(s.intro, digest)
		ok = false
	}
	s.introMu.Unlock()
	if ok {
		if c.p == nil {
			return nil, invalid("the token is not active")
		}
		return c.p, nil
	}
	var p *Principal
	var last error
	for _, id := range s.c.Issuers {
		iss := s.issuers[id]
		var err error
		if p, err = iss.introspect(ctx, token); err != nil {
			last = err
			continue
		}
		if p != nil {
			break
		}
	}
	if p == nil && last != nil {
		return nil, last
	}
	until := now.Add(s.c.IntrospectionCache)
	if p != nil && p.Expiry.Before(until) {
		until = p.Expiry
	}
	s.introMu.Lock()
	s.sweep(now)
	if len(s.intro) < maxIntrospected {
		s.intro[digest] = introspected{p: p, until: until}
	}
	s.introMu.Unlock()
	if p == nil {
		return nil, invalid("the token is not active")
	}
	return p, nil
}

// maxIntrospected bounds the cache: past it, answers are not kept (a
// flood of distinct tokens costs introspections, not memory; the
// bad-token throttle bounds those).
const maxIntrospected = 8192

// sweep drops expired cache entries once the cache has grown.
func (s *Server) sweep(now time.Time) {
	if len(s.intro) < 1024 {
		return
	}
	for k, c := range s.intro {
		if !now.Before(c.until) {
			delete(s.intro, k)
		}
	}
}

// introspect asks this issuer about token: a principal when it is active
// and issued for this resource, nil when it is not.
func (i *issuer) introspect(ctx context.Context, token string) (*Principal, error) {
	i.mu.Lock()
	m, err := i.metadata(ctx)
	i.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if m.IntrospectionEndpoint == "" {
		return nil, fmt.Errorf("%w: issuer %s publishes no introspection_endpoint", ErrUnavailable, i.id)
	}
	form := url.Values{"token": {token}, "token_type_hint": {"access_token"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.IntrospectionEndpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.SetBasicAuth(url.QueryEscape(i.s.c.IntrospectionClient), url.QueryEscape(i.s.c.IntrospectionSecret))
	resp, err := i.s.c.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: introspection at issuer %s: %v", ErrUnavailable, i.id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: introspection at issuer %s answered %s", ErrUnavailable, i.id, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var r introspection
	var all map[string]any
	if err == nil {
		err = json.Unmarshal(body, &r)
	}
	if err == nil {
		err = json.Unmarshal(body, &all)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: introspection at issuer %s: %v", ErrUnavailable, i.id, err)
	}
	now := i.s.c.Clock.Now()
	if !r.Active || r.Exp == 0 || !now.Before(time.Unix(r.Exp, 0).Add(i.s.c.Skew)) ||
		(r.Nbf != 0 && now.Add(i.s.c.Skew).Before(time.Unix(r.Nbf, 0))) ||
		(r.Iss != "" && r.Iss != i.id) || !audience(r.Aud, i.s.c.Audience) {
		return nil, nil
	}
	return &Principal{Issuer: i.id, Subject: r.Sub, ClientID: r.ClientID, Scopes: strings.Fields(r.Scope),
		Expiry: time.Unix(r.Exp, 0), Claims: all}, nil
}

// audience reports whether raw (a string or an array of them) names
// resource.
func audience(raw json.RawMessage, resource string) bool {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one == resource
	}
	var many []string
	return json.Unmarshal(raw, &many) == nil && slices.Contains(many, resource)
}
