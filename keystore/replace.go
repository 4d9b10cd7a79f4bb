package keystore

import (
	"time"
)

// The methods of a Store read the contents it holds at the time of the
// call (see Replace); what they return (a *Key, a *Caller) is kept by
// the caller as it was, whatever replaces it later.

var noContents = &contents{}

func newStore(c *contents) *Store {
	s := &Store{}
	s.cur.Store(c)
	return s
}

func (s *Store) load() *contents {
	if c := s.cur.Load(); c != nil {
		return c
	}
	return noContents
}

// Replace makes s hold what n holds, at once: every holder of s sees
// n's keys, callers, policies, principals and settings in the lookups it
// makes from now on, while a call that resolved a *Key or a *Caller
// before keeps it, and finishes under the configuration it started
// with. n is left as it is. It is safe for concurrent use with every
// other method.
func (s *Store) Replace(n *Store) { s.cur.Store(n.load()) }

// State is where the configuration puts the state (a file path or a
// PostgreSQL URL); empty when it says nothing.
func (s *Store) State() string { return s.load().State() }

// StateTimeout is the configuration's bound on a PostgreSQL state's
// transactions; zero when it says nothing.
func (s *Store) StateTimeout() time.Duration { return s.load().StateTimeout() }

// Retention is how long the state keeps the activity: the configuration's
// retention, or DefaultRetention (an hour beyond the longest documented
// window when that is longer).
func (s *Store) Retention() time.Duration { return s.load().Retention() }

// Keys returns every configured key, in configuration order.
func (s *Store) Keys() []*Key { return s.load().Keys() }

// Callers returns every configured caller, in configuration order.
func (s *Store) Callers() []*Caller { return s.load().Callers() }

// Key returns the key called name. When name is empty and exactly one key
// is configured, it returns that key.
func (s *Store) Key(name string) (*Key, error) { return s.load().Key(name) }

// KeyNames returns the names of all keys, in configuration order.
func (s *Store) KeyNames() []string { return s.load().KeyNames() }

// Authenticate returns the caller whose token is token, comparing in
// constant time.
func (s *Store) Authenticate(token string) (*Caller, bool) { return s.load().Authenticate(token) }

// For returns the Store as caller c sees it: only the keys c may use, and
// no callers.
func (s *Store) For(c *Caller) *Store { return s.load().For(c) }

// OAuth returns the [oauth] table; nil when there is none.
func (s *Store) OAuth() *OAuth { return s.load().OAuth() }

// ExtraScopes are the scopes the keys name beyond [oauth]'s.
func (s *Store) ExtraScopes() []string { return s.load().ExtraScopes() }

// NeedScopes returns the scopes a token needs to use k with method.
func (s *Store) NeedScopes(k *Key, method string) []string { return s.load().NeedScopes(k, method) }

// Principal returns the caller an access token's claims make.
func (s *Store) Principal(c Claims) (*Caller, error) { return s.load().Principal(c) }

// Scrubber returns the Scrubber of every credential the store holds: the
// keys' and the callers' tokens. Nil when there is none to look for.
func (s *Store) Scrubber() *Scrubber { return s.load().Scrubber() }

// BodyMemory is the configuration's bound, in bytes, on the memory that
// bodies in flight take; zero when it says nothing.
func (s *Store) BodyMemory() int64 { return s.load().BodyMemory() }

// TLS is where the configuration puts serve's certificate and its private
// key; empty when it says nothing.
func (s *Store) TLS() (cert, key string) { return s.load().TLS() }
