package main

import (
	"context"
	"fmt"

	"github.com/mcp-quota/mcp-quota/dashboard"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/oauth"
)

// oauthServer returns the OAuth resource server the configuration's
// [oauth] table describes, or nil when it has none.
func oauthServer(keys *keystore.Store) (*oauth.Server, error) {
	o := keys.OAuth()
	if o == nil {
		return nil, nil
	}
	return oauth.New(oauth.Config{Issuers: o.Issuers, Resource: o.Resource, Audience: o.Audience, Scopes: o.Scopes, ExtraScopes: keys.ExtraScopes(),
		Algorithms: o.Algorithms, Skew: o.Skew, IntrospectionClient: o.IntrospectionClient,
		IntrospectionSecret: o.IntrospectionSecret.Reveal(), IntrospectionCache: o.IntrospectionCache})
}

// dashboardOIDC is the dashboard's sign-in with the authorization server,
// when [oauth] is configured: with the dashboard client it names, or one
// the dashboard registers there.
func dashboardOIDC(keys *keystore.Store, srv *oauth.Server) *dashboard.OIDC {
	o := keys.OAuth()
	if srv == nil || o == nil {
		return nil
	}
	return &dashboard.OIDC{Name: o.IssuerName, Issuer: o.Issuers[0], ClientID: o.DashboardClient, ClientSecret: o.DashboardSecret.Reveal(), Resource: o.Resource,
		Scopes: o.Scopes, Endpoints: srv.Endpoints, Registration: srv.Registration,
		Caller: func(ctx context.Context, token string) (*keystore.Caller, error) {
			p, err := srv.Verify(ctx, token)
			if err != nil {
				return nil, fmt.Errorf("the sign-in's token is not valid here: %w", err)
			}
			if !p.HasScopes(o.Scopes) {
				return nil, fmt.Errorf("the sign-in's token lacks the scopes %v", o.Scopes)
			}
			return keys.Principal(p)
		}}
}
