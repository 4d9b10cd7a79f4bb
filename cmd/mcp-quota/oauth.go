package main

import (
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
	return oauth.New(oauth.Config{Issuers: o.Issuers, Resource: o.Resource, Scopes: o.Scopes, ExtraScopes: keys.ExtraScopes(),
		Algorithms: o.Algorithms, Skew: o.Skew, IntrospectionClient: o.IntrospectionClient,
		IntrospectionSecret: o.IntrospectionSecret.Reveal(), IntrospectionCache: o.IntrospectionCache})
}
