// Package keystore holds the keys mcp-quota spends and the callers allowed
// to spend them: for each key its upstream base URL, where its credential
// comes from and how it is sent, the policies its API documents, how to
// read the API's rate-limit headers, and the local safety limits; for each
// caller its token and the keys it may use.
//
// A Store is read from a TOML file (see Parse). Credentials are read from
// the environment or from files, never from the configuration itself, and
// are held as Secrets that cannot print themselves.
package keystore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// Errors a Store returns; check them with errors.Is.
var (
	// ErrUnknownKey reports a key name that is not configured.
	ErrUnknownKey = errors.New("unknown key")
	// ErrNoCredential reports a key whose credential could not be read.
	ErrNoCredential = errors.New("credential unavailable")
)

// A Policy is a limit the upstream API documents for a key: no more than
// Quota units per Window. mcp-quota enforces it locally across every
// caller and process that shares the key.
type Policy struct {
	Name   string
	Quota  int64
	Window time.Duration
	Unit   ratelimit.Unit // ratelimit.Requests when empty
}

// An Auth says how a key's credential is put on an upstream request.
type Auth struct {
	Kind AuthKind
	Name string // the header or query parameter name, for AuthHeader and AuthQuery
}

// An AuthKind is one way of sending a credential.
type AuthKind string

// The ways a credential can be sent.
const (
	AuthBearer AuthKind = "bearer" // Authorization: Bearer <secret>
	AuthHeader AuthKind = "header" // <Name>: <secret>
	AuthQuery  AuthKind = "query"  // ?<Name>=<secret>
	AuthNone   AuthKind = "none"   // no credential
)

// String returns the auth in its configuration syntax.
func (a Auth) String() string {
	if a.Kind == AuthHeader || a.Kind == AuthQuery {
		return string(a.Kind) + ":" + a.Name
	}
	return string(a.Kind)
}

// A Reserve keeps a share of every policy of a key for one caller, so that
// other callers cannot starve it. A reservation its caller leaves idle is
// lent to the others.
type Reserve struct {
	Caller string
	Share  float64 // in (0, 1)
}

// A Key is one upstream credential and everything mcp-quota knows about
// the API it opens. A Key is immutable once loaded and safe for
// concurrent use.
type Key struct {
	Name    string
	BaseURL *url.URL
	Auth    Auth
	Profile ratelimit.Profile

	// Policies are the limits the API documents.
	Policies []Policy
	// AllowHosts are hosts besides BaseURL's that calls may reach.
	AllowHosts []string
	// Methods are the HTTP methods the MCP fetch tool may use with this
	// key. REST callers may use any method.
	Methods []string
	// Scopes are the OAuth scopes a token needs to use this key, and
	// WriteScopes those it needs besides for a method other than GET and
	// HEAD (static caller tokens need none).
	Scopes, WriteScopes []string
	// Reserves keep shares of the budget for named callers.
	Reserves []Reserve
	// Shares cap what each principal may spend of the key's budget per
	// window, and make principals waiting for it take turns (see Share).
	Shares []Share

	// MaxRate caps calls per second, whatever the upstream announces.
	MaxRate float64
	// MaxConcurrency caps calls in flight at once, across processes.
	MaxConcurrency int
	// LowWater is the share of a policy's quota below which calls are
	// spread over what is left of its window.
	LowWater float64
	// UnreachableHint is told to a caller when the upstream cannot be
	// reached, in place of "try again later": how to bring it back, for
	// instance. Empty means no hint.
	UnreachableHint string

	secret    Secret
	secretErr error     // why the credential could not be read
	scrub     *Scrubber // finds secret in what leaves mcp-quota
}

// Credential returns the key's secret, or an error wrapping
// ErrNoCredential that says where it was looked for.
func (k *Key) Credential() (Secret, error) {
	if k.secretErr != nil {
		return Secret{}, k.secretErr
	}
	return k.secret, nil
}

// AllowsMethod reports whether the MCP fetch tool may use method m.
func (k *Key) AllowsMethod(m string) bool {
	return slices.Contains(k.Methods, strings.ToUpper(m))
}

// ReadOnly reports whether the MCP fetch tool can only read through this
// key (GET, HEAD and OPTIONS).
func (k *Key) ReadOnly() bool {
	for _, m := range k.Methods {
		if m != "GET" && m != "HEAD" && m != "OPTIONS" {
			return false
		}
	}
	return true
}

// AllowsHost reports whether a request may go to host (a URL's Host,
// with port when it has one).
func (k *Key) AllowsHost(host string) bool {
	return strings.EqualFold(host, k.BaseURL.Host) ||
		slices.ContainsFunc(k.AllowHosts, func(h string) bool { return strings.EqualFold(h, host) })
}

// A Caller is a client of mcp-quota's HTTP side (REST or MCP), known by
// its token. Callers on stdio are the local user and need no token.
type Caller struct {
	Name  string
	Keys  []string // the keys it may use; "*" means all
	OAuth bool     // a principal of an OAuth token, not a [[callers]] token
	// Sight is whose calls the caller sees on the dashboard and in the
	// activity; nil means every call of the keys it may use.
	Sight *Sight
	token Secret
	// visibleTo are the principals and groups that see this caller's
	// calls (its [[callers]] entry's visible_to).
	visibleTo []string
}

// MayUse reports whether the caller may spend key.
func (c *Caller) MayUse(key string) bool {
	return slices.Contains(c.Keys, key) || slices.Contains(c.Keys, "*")
}

// A Store is the set of configured keys and callers. The zero value has
// none. Its contents change only all at once, by Replace; it is safe for
// concurrent use.
type Store struct {
	cur atomic.Pointer[contents] // nil: no keys, no callers
}

// contents is what a Store holds at one time.
type contents struct {
	keys      []*Key
	callers   []*Caller
	retention time.Duration

	oauth      *OAuth
	principals []PrincipalRule

	state        string
	stateTimeout time.Duration
	bodyMemory   int64
	tlsCert      string
	tlsKey       string
}

// TLS is where the configuration puts serve's certificate and its
// private key (PEM files); empty when it says nothing.
func (s *contents) TLS() (cert, key string) { return s.tlsCert, s.tlsKey }

// BodyMemory is the configuration's bound, in bytes, on the memory that
// request and answer bodies in flight take across all callers; zero when
// it says nothing (the upstream client's default then holds).
func (s *contents) BodyMemory() int64 { return s.bodyMemory }

// State is where the configuration puts the state (a file path or a
// PostgreSQL URL); empty when it says nothing.
func (s *contents) State() string { return s.state }

// StateTimeout is the configuration's bound on a PostgreSQL state's
// transactions; zero when it says nothing.
func (s *contents) StateTimeout() time.Duration { return s.stateTimeout }

// Retention is how long the state keeps the activity: the configuration's
// retention, or DefaultRetention (an hour beyond the longest documented
// window when that is longer).
func (s *contents) Retention() time.Duration {
	if s.retention <= 0 {
		return DefaultRetention
	}
	return s.retention
}

// Keys returns every configured key, in configuration order.
func (s *contents) Keys() []*Key { return s.keys }

// Callers returns every configured caller, in configuration order.
func (s *contents) Callers() []*Caller { return s.callers }

// Key returns the key called name. When name is empty and exactly one key
// is configured, it returns that key.
func (s *contents) Key(name string) (*Key, error) {
	if name == "" {
		switch len(s.keys) {
		case 1:
			return s.keys[0], nil
		case 0:
			return nil, fmt.Errorf("%w: no keys are configured", ErrUnknownKey)
		}
		return nil, fmt.Errorf("%w: name one of %s", ErrUnknownKey, strings.Join(s.KeyNames(), ", "))
	}
	for _, k := range s.keys {
		if k.Name == name {
			return k, nil
		}
	}
	if len(s.keys) == 0 {
		return nil, fmt.Errorf("%w %q: no keys are configured", ErrUnknownKey, name)
	}
	return nil, fmt.Errorf("%w %q: configured keys are %s", ErrUnknownKey, name, strings.Join(s.KeyNames(), ", "))
}

// KeyNames returns the names of all keys, in configuration order.
func (s *contents) KeyNames() []string {
	names := make([]string, len(s.keys))
	for i, k := range s.keys {
		names[i] = k.Name
	}
	return names
}

// Authenticate returns the caller whose token is token. It compares
// against every caller's token in constant time, so the time it takes
// does not reveal which token was close.
func (s *contents) Authenticate(token string) (*Caller, bool) {
	var found *Caller
	for _, c := range s.callers {
		if c.token.Equal(token) && token != "" {
			found = c
		}
	}
	return found, found != nil
}

// Local returns the caller of a stdio session: the local user, who may use
// every key.
func Local(name string) *Caller {
	return &Caller{Name: name, Keys: []string{"*"}}
}

type callerKey struct{}

// WithCaller returns a context carrying c, the authenticated caller.
func WithCaller(ctx context.Context, c *Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the caller ctx carries, if any.
func CallerFrom(ctx context.Context) (*Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(*Caller)
	return c, ok && c != nil
}

// For returns the Store as caller c sees it: only the keys c may use, and
// no callers. What it returns is what an error or a description shown to
// c may name.
func (s *contents) For(c *Caller) *Store {
	out := &contents{}
	for _, k := range s.keys {
		if c.MayUse(k.Name) {
			out.keys = append(out.keys, k)
		}
	}
	return newStore(out)
}
