package state

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// A state location is either a SQLite file's path or a PostgreSQL
// database, named by a URL (postgres://user@host:5432/db?sslmode=require)
// or by a keyword/value connection string, as libpq reads it
// (https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-CONNSTRING-KEYWORD-VALUE):
//
//	connstring = *( keyword *SP "=" *SP value *SP )
//	value      = "'" *( char / "\'" / "\\" ) "'" / 1*( non-space / "\" char )
//
// A location that begins as a keyword/value string does ("word=") is
// read as one, never as a file's path: a file whose name starts that way
// is named ./NAME.

// kvStart is how a keyword/value connection string begins.
var kvStart = regexp.MustCompile(`^\s*[A-Za-z_]+\s*=`)

// pgKeywords are the keywords libpq knows in a connection string.
var pgKeywords = []string{
	"application_name", "channel_binding", "client_encoding", "connect_timeout", "dbname", "fallback_application_name",
	"gssdelegation", "gssencmode", "gsslib", "host", "hostaddr", "keepalives", "keepalives_count", "keepalives_idle",
	"keepalives_interval", "krbsrvname", "load_balance_hosts", "max_protocol_version", "min_protocol_version", "options",
	"passfile", "password", "port", "replication", "require_auth", "requirepeer", "service", "sslcert", "sslcertmode",
	"sslcompression", "sslcrl", "sslcrldir", "sslkey", "sslmode", "sslnegotiation", "sslpassword", "sslrootcert", "sslsni",
	"ssl_max_protocol_version", "ssl_min_protocol_version", "target_session_attrs", "tcp_user_timeout", "user",
}

// IsPostgresURL reports whether state names a PostgreSQL database by a
// URL (postgres:// or postgresql://).
func IsPostgresURL(state string) bool {
	return strings.HasPrefix(state, "postgres://") || strings.HasPrefix(state, "postgresql://")
}

// isKeywordValue reports whether location begins as a keyword/value
// connection string does.
func isKeywordValue(location string) bool { return kvStart.MatchString(location) }

// IsPostgres reports whether location names a PostgreSQL database (a
// URL or a keyword/value connection string) rather than a SQLite file.
// A keyword/value string that does not parse is still PostgreSQL's:
// opening it says what is wrong with it.
func IsPostgres(location string) bool {
	return IsPostgresURL(location) || isKeywordValue(location)
}

// A kv is one setting of a keyword/value connection string.
type kv struct{ key, value string }

// parseKeywordValue reads a keyword/value connection string. Its errors
// never quote a value.
func parseKeywordValue(s string) ([]kv, error) {
	var out []kv
	i := 0
	space := func() {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
			i++
		}
	}
	for {
		space()
		if i == len(s) {
			return out, nil
		}
		start := i
		for i < len(s) && (s[i] >= 'a' && s[i] <= 'z' || s[i] >= 'A' && s[i] <= 'Z' || s[i] == '_') {
			i++
		}
		key := s[start:i]
		space()
		if key == "" || i == len(s) || s[i] != '=' {
			return nil, fmt.Errorf("setting %d is not keyword=value", len(out)+1)
		}
		if !slices.Contains(pgKeywords, key) {
			return nil, fmt.Errorf("%q is not a PostgreSQL connection keyword", key)
		}
		i++
		space()
		var v strings.Builder
		if i < len(s) && s[i] == '\'' {
			i++
			closed := false
			for i < len(s) {
				c := s[i]
				i++
				if c == '\\' && i < len(s) {
					v.WriteByte(s[i])
					i++
					continue
				}
				if c == '\'' {
					closed = true
					break
				}
				v.WriteByte(c)
			}
			if !closed {
				return nil, fmt.Errorf("the value of %s has no closing quote", key)
			}
		} else {
			for i < len(s) && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r' {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				v.WriteByte(s[i])
				i++
			}
		}
		out = append(out, kv{key, v.String()})
	}
}

// HasPassword reports whether location carries a password: in a URL's
// user part or its password parameter, or as a keyword/value string's
// password. A location that does not parse is said to carry one when it
// names the password at all, so that it is refused rather than shown.
func HasPassword(location string) bool {
	switch {
	case isKeywordValue(location):
		settings, err := parseKeywordValue(location)
		if err != nil {
			return strings.Contains(location, "password")
		}
		return slices.ContainsFunc(settings, func(s kv) bool { return s.key == "password" })
	case urlScheme.MatchString(location):
		u, err := url.Parse(location)
		if err != nil {
			rest := location[strings.Index(location, "://")+3:]
			at := strings.LastIndex(rest, "@")
			return at >= 0 && strings.Contains(rest[:at], ":") || strings.Contains(location, "password=")
		}
		_, ok := u.User.Password()
		return ok || u.Query().Has("password")
	}
	return false
}

// urlScheme matches a URL's scheme, as RFC 3986 §3.1 writes it, followed
// by "://"; a Windows path (C:\…) has no "//".
var urlScheme = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*)://`)

// Redact returns location as it may be shown: a file's path as it is, a
// URL or a keyword/value string with its password replaced by xxxxx. One
// that does not parse is not shown at all.
func Redact(location string) string {
	switch {
	case isKeywordValue(location):
		settings, err := parseKeywordValue(location)
		if err != nil {
			return "(a PostgreSQL connection string)"
		}
		parts := make([]string, len(settings))
		for i, s := range settings {
			v := s.value
			if s.key == "password" {
				v = "xxxxx"
			}
			if v == "" || strings.ContainsAny(v, " \t\n\r'\\") {
				v = "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
			}
			parts[i] = s.key + "=" + v
		}
		return strings.Join(parts, " ")
	case urlScheme.MatchString(location):
		u, err := url.Parse(location)
		if err != nil {
			return "(a URL)"
		}
		if q := u.Query(); q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.Redacted()
	}
	return location
}

// ErrPassword is the refusal of a location with a password; its text
// says where the password goes instead.
var ErrPassword = errors.New("carries a password: remove it, and give it in PGPASSWORD or a password file " +
	"(~/.pgpass, or the file PGPASSFILE names), so that it is in no config file, command line or process list")
