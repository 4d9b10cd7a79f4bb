package keystore

import (
	"crypto/subtle"
	"log/slog"
)

// redacted is what every printer shows instead of a secret.
const redacted = "[redacted]"

// A Secret is a credential: an upstream API key or a caller token. Only
// Reveal returns its value; String, GoString, LogValue, MarshalJSON and
// MarshalText all print a redaction, and the value sits behind a pointer
// so that printing a struct that holds a Secret with %+v or %#v shows an
// address, not the value. The zero value is an empty secret. A Secret is
// immutable and safe for concurrent use.
type Secret struct{ p *string }

// NewSecret returns a Secret holding v.
func NewSecret(v string) Secret { return Secret{&v} }

// Reveal returns the secret's value, or "" for the zero Secret. Call it
// only where the value is put on the wire.
func (s Secret) Reveal() string {
	if s.p == nil {
		return ""
	}
	return *s.p
}

// IsZero reports whether the secret is empty.
func (s Secret) IsZero() bool { return s.Reveal() == "" }

// Equal reports whether s holds v, in time independent of where they differ.
func (s Secret) Equal(v string) bool {
	return subtle.ConstantTimeCompare([]byte(s.Reveal()), []byte(v)) == 1
}

func (s Secret) String() string               { return redacted }
func (s Secret) GoString() string             { return "keystore.Secret(" + redacted + ")" }
func (s Secret) LogValue() slog.Value         { return slog.StringValue(redacted) }
func (s Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }
func (s Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }
