package oauth

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// MetadataPaths are where the protected resource metadata is served: the
// well-known URI, and its form suffixed with the resource's path (RFC 9728
// §3.1), which clients of the MCP endpoint try first.
func (s *Server) MetadataPaths() []string { return s.metaPath }

// MetadataURL is the metadata's URL that challenges name: the
// path-suffixed form, at the resource's origin.
func (s *Server) MetadataURL() string {
	scheme, rest, _ := strings.Cut(s.c.Resource, "://")
	host, _, _ := strings.Cut(rest, "/")
	return scheme + "://" + host + s.metaPath[len(s.metaPath)-1]
}

// ServeMetadata answers GET of the protected resource metadata (RFC 9728
// §3.2): the resource, its trusted authorization servers, its scopes and
// that tokens go in the Authorization header.
func (s *Server) ServeMetadata(w http.ResponseWriter, r *http.Request) {
	scopes := append(slices.Clone(s.c.Scopes), s.c.ExtraScopes...)
	slices.Sort(scopes)
	scopes = slices.Compact(scopes)
	doc := map[string]any{
		"resource":                 s.c.Resource,
		"authorization_servers":    s.c.Issuers,
		"bearer_methods_supported": []string{"header"},
		"resource_name":            "mcp-quota",
	}
	if len(scopes) > 0 {
		doc["scopes_supported"] = scopes
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	_ = json.NewEncoder(w).Encode(doc)
}

// Challenge is the WWW-Authenticate value of a 401 (errorCode
// "invalid_token", or "" when no token was sent) or a 403 (errorCode
// "insufficient_scope", scopes those needed): it names the metadata and
// the scopes to ask for, all of them in one challenge.
func (s *Server) Challenge(errorCode string, scopes []string) string {
	if scopes == nil {
		scopes = s.c.Scopes
	}
	v := `Bearer resource_metadata="` + s.MetadataURL() + `"`
	if errorCode != "" {
		v += `, error="` + errorCode + `"`
	}
	if len(scopes) > 0 {
		v += `, scope="` + strings.Join(scopes, " ") + `"`
	}
	return v
}

// Endpoints returns the first issuer's authorization and token endpoints,
// for a sign-in with it (the dashboard's).
func (s *Server) Endpoints(ctx context.Context) (authorize, token string, err error) {
	i := s.issuers[s.c.Issuers[0]]
	i.mu.Lock()
	m, err := i.metadata(ctx)
	i.mu.Unlock()
	if err != nil {
		return "", "", err
	}
	if m.AuthorizationEndpoint == "" || m.TokenEndpoint == "" {
		return "", "", fmt.Errorf("%w: issuer %s publishes no authorization or token endpoint", ErrUnavailable, i.id)
	}
	return m.AuthorizationEndpoint, m.TokenEndpoint, nil
}

// Registration returns the first issuer's dynamic client registration
// endpoint (RFC 7591), or "" when its metadata names none.
func (s *Server) Registration(ctx context.Context) (string, error) {
	i := s.issuers[s.c.Issuers[0]]
	i.mu.Lock()
	m, err := i.metadata(ctx)
	i.mu.Unlock()
	if err != nil {
		return "", err
	}
	return m.RegistrationEndpoint, nil
}
