package keystore

import (
	"errors"
	"fmt"
	"github.com/mcp-quota/mcp-quota/internal/spelling"
	"math"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// Defaults for the local safety limits of a key.
const (
	DefaultMaxRate        = 10.0 // calls per second
	DefaultMaxConcurrency = 4
	DefaultLowWater       = 0.1
)

// An Env reads the environment and files a configuration points at. The
// zero value reads the process environment and the file system.
type Env struct {
	Getenv   func(string) string          // nil means os.Getenv
	ReadFile func(string) ([]byte, error) // nil means os.ReadFile

	// NoCallerTokens is for a command that authenticates no caller
	// (status, activity, stdio): the callers' tokens are not read, so an
	// unset token variable or a missing token file is no mistake there.
	// Such a Store's callers match no token.
	NoCallerTokens bool

	// CheckState checks the configuration's state location (the state
	// knows what a location may hold: cmd/mcp-quota gives it the state's
	// refusal of a password). Its error, which completes "the state …",
	// is reported at the line of state with the file's other mistakes.
	// nil means the location is kept as written; opening the state checks
	// it again.
	CheckState func(location string) error
}

func (e Env) getenv(name string) string {
	if e.Getenv == nil {
		return os.Getenv(name)
	}
	return e.Getenv(name)
}

func (e Env) readFile(name string) ([]byte, error) {
	if e.ReadFile == nil {
		return os.ReadFile(name)
	}
	return e.ReadFile(name)
}

// fileConfig is the TOML file's shape.
type fileConfig struct {
	// Retention is how long the state keeps attempts, observations and
	// warnings (the activity); default DefaultRetention.
	Retention duration `toml:"retention"`
	// State is where the state is kept: a SQLite file's path, or a
	// PostgreSQL URL (postgres://user@host:5432/db?sslmode=…) without a
	// password. --state and MCP_QUOTA_STATE override it.
	State string `toml:"state"`
	// StateTimeout bounds each transaction on a PostgreSQL state of the
	// processes that serve calls (serve, stdio); the commands a person
	// runs (status, activity) wait at least 10 s.
	StateTimeout duration `toml:"state_timeout"`
	// BodyMemoryMiB bounds the memory bodies in flight take across all
	// callers, in MiB; default 64 (see BodyMemory).
	BodyMemoryMiB int64 `toml:"body_memory_mib"`
	// TLSCert and TLSKey are the PEM files of serve's TLS listener (the
	// certificate with its chain, and its private key); --tls-cert and
	// --tls-key override them.
	TLSCert string         `toml:"tls_cert"`
	TLSKey  string         `toml:"tls_key"`
	Keys    []keyConfig    `toml:"keys"`
	Callers []callerConfig `toml:"callers"`
	// OAuth turns on the OAuth resource server; Principals map its
	// tokens to keys.
	OAuth      *oauthConfig      `toml:"oauth"`
	Principals []principalConfig `toml:"principals"`
}

// DefaultRetention is how long the state keeps the activity when the
// configuration says nothing and no key documents a window as long.
const DefaultRetention = 7 * 24 * time.Hour

// MinRetention is the shortest retention a configuration may set; it
// must also be at least the longest window a key documents, which the
// state must still hold to count.
const MinRetention = time.Hour

type keyConfig struct {
	Name           string          `toml:"name"`
	BaseURL        string          `toml:"base_url"`
	SecretEnv      string          `toml:"secret_env"`
	SecretFile     string          `toml:"secret_file"`
	Auth           string          `toml:"auth"`
	Profile        string          `toml:"profile"`
	Policies       []policyConfig  `toml:"policies"`
	AllowHosts     []string        `toml:"allow_hosts"`
	Methods        []string        `toml:"methods"`
	Reserve        []reserveConfig `toml:"reserve"`
	Share          []shareConfig   `toml:"share"`
	MaxRate        *float64        `toml:"max_rate"`
	MaxConcurrency *int            `toml:"max_concurrency"`
	LowWater       *float64        `toml:"low_water"`
	Scopes         []string        `toml:"scopes"`
	WriteScopes    []string        `toml:"write_scopes"`
	Unreachable    string          `toml:"unreachable_hint"`
	Secret         *string         `toml:"secret"` // refused: secrets are never inline
}

type policyConfig struct {
	Name   string   `toml:"name"`
	Quota  int64    `toml:"quota"`
	Window duration `toml:"window"`
	Unit   string   `toml:"unit"`
}

type reserveConfig struct {
	Caller string  `toml:"caller"`
	Share  float64 `toml:"share"`
}

type callerConfig struct {
	Name      string   `toml:"name"`
	TokenEnv  string   `toml:"token_env"`
	TokenFile string   `toml:"token_file"`
	Keys      []string `toml:"keys"`
	VisibleTo []string `toml:"visible_to"`
}

// duration is a time.Duration written as a Go duration string ("60s",
// "1h") or a number of seconds.
type duration time.Duration

func (d *duration) UnmarshalText(b []byte) error {
	s := string(b)
	if v, err := time.ParseDuration(s); err == nil {
		*d = duration(v)
	} else if n, err2 := parseSeconds(s); err2 == nil {
		*d = duration(n)
	} else {
		return fmt.Errorf("invalid duration %q: write it like \"60s\", \"15m\" or \"24h\"", s)
	}
	if *d <= 0 {
		return fmt.Errorf("duration %q must be positive", s)
	}
	return nil
}

func parseSeconds(s string) (time.Duration, error) {
	var n float64
	if _, err := fmt.Sscanf(s, "%g", &n); err != nil || math.IsNaN(n) || n > 1e9 {
		return 0, errors.New("not a number of seconds")
	}
	return time.Duration(n * float64(time.Second)), nil
}

// A ConfigError is a configuration mistake, with where it is.
type ConfigError struct {
	File  string // the file name, when read from one
	Line  int    // 1-based, the line of the field itself when it is written; 0 when unknown
	Field string // e.g. "keys[1].base_url"
	Msg   string
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
	} else {
		b.WriteString("config")
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	if e.Field != "" {
		fmt.Fprintf(&b, ": %s", e.Field)
	}
	b.WriteString(": ")
	b.WriteString(e.Msg)
	return b.String()
}

// ConfigErrors are every mistake of one file, in the order of their lines.
// errors.As finds each *ConfigError in it.
type ConfigErrors []*ConfigError

func (es ConfigErrors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return fmt.Sprintf("%d mistakes in the configuration:\n  %s", len(es), strings.Join(lines, "\n  "))
}

func (es ConfigErrors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// Load reads the configuration file at path. A missing file is reported
// with an error satisfying errors.Is(err, fs.ErrNotExist).
func Load(path string, env Env) (*Store, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s, err := Parse(data, env)
	var ce *ConfigError
	var ces ConfigErrors
	switch {
	case errors.As(err, &ces):
		for _, e := range ces {
			e.File = path
		}
	case errors.As(err, &ce):
		ce.File = path
	}
	return s, err
}

// Parse reads a TOML configuration:
//
//	[[keys]]
//	name = "example"                  # used in tool calls and REST paths
//	base_url = "https://api.example.com"
//	secret_env = "EXAMPLE_API_KEY"    # or secret_file = "/path"; never inline
//	auth = "bearer"                   # bearer | header:X-Api-Key | query:api_key | none
//	profile = "ietf"                  # how to read X-RateLimit-* for this API
//	  [[keys.policies]]
//	  name = "default"
//	  quota = 120
//	  window = "60s"
//
//	[[callers]]
//	name = "sync"
//	token_env = "SYNC_TOKEN"
//	keys = ["example"]
//
// Mistakes are reported as a *ConfigError naming the line of the field
// and the field, or, when there are several, as ConfigErrors listing them
// all. A key whose credential cannot be read is kept: calls through it
// fail with ErrNoCredential, so one missing variable does not stop the rest.
func Parse(data []byte, env Env) (*Store, error) {
	var raw map[string]any
	if _, err := toml.Decode(string(data), &raw); err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, &ConfigError{Line: pe.Position.Line, Field: pe.LastKey, Msg: pe.Message}
		}
		return nil, &ConfigError{Msg: err.Error()}
	}
	lines := indexLines(data)
	var errs []*ConfigError
	checkShape("", "", raw, reflect.TypeFor[fileConfig](), &errs)
	if len(errs) > 0 {
		// The values are checked only once the shape is right: a field
		// of the wrong type would otherwise be reported again as missing.
		return nil, located(errs, lines)
	}
	var fc fileConfig
	if _, err := toml.Decode(string(data), &fc); err != nil {
		return nil, &ConfigError{Msg: err.Error()}
	}
	s := &contents{retention: DefaultRetention}
	declared := map[string]bool{}
	for _, kc := range fc.Keys {
		declared[kc.Name] = true
	}
	for i, kc := range fc.Keys {
		k, kerrs := kc.key(env)
		for _, err := range kerrs {
			err.Field = fmt.Sprintf("keys[%d].%s", i, err.Field)
		}
		errs = append(errs, kerrs...)
		if k == nil {
			continue
		}
		if slices.ContainsFunc(s.keys, func(o *Key) bool { return o.Name == k.Name }) {
			errs = append(errs, &ConfigError{Field: fmt.Sprintf("keys[%d].name", i), Msg: fmt.Sprintf("key %q is configured twice", k.Name)})
			continue
		}
		s.keys = append(s.keys, k)
	}
	for i, cc := range fc.Callers {
		c, cerrs := cc.caller(env, declared)
		for _, err := range cerrs {
			err.Field = fmt.Sprintf("callers[%d].%s", i, err.Field)
		}
		errs = append(errs, cerrs...)
		if c == nil {
			continue
		}
		if slices.ContainsFunc(s.callers, func(o *Caller) bool { return o.Name == c.Name }) {
			errs = append(errs, &ConfigError{Field: fmt.Sprintf("callers[%d].name", i), Msg: fmt.Sprintf("caller %q is configured twice", c.Name)})
			continue
		}
		s.callers = append(s.callers, c)
	}
	errs = append(errs, s.parseOAuth(fc.OAuth, fc.Principals, env, declared)...)
	errs = append(errs, s.settings(fc, env)...)
	if len(errs) > 0 {
		return nil, located(errs, lines)
	}
	return newStore(s), nil
}

// settings checks and sets the file's top-level settings: retention, the
// state, its timeout, the memory for bodies and TLS.
func (s *contents) settings(fc fileConfig, env Env) []*ConfigError {
	var errs []*ConfigError
	shortest := MinRetention // the shortest retention that still holds every documented window
	for _, k := range s.keys {
		for _, p := range k.Policies {
			shortest = max(shortest, p.Window)
		}
	}
	// Unwritten, the retention is the default, or the longest documented
	// window and an hour more when that is longer: a key documenting a
	// month must not have its window's calls swept after a week.
	s.retention = max(DefaultRetention, shortest+MinRetention)
	if fc.Retention != 0 {
		s.retention = time.Duration(fc.Retention)
		if s.retention < shortest {
			errs = append(errs, &ConfigError{Field: "retention", Msg: fmt.Sprintf(
				"retention %s is shorter than %s, the longest window the state must count (and at least an hour): write retention = %q or more",
				s.retention, shortest, shortest.String())})
		}
	}
	if err := env.checkState(fc.State); err != nil {
		errs = append(errs, err)
	}
	s.state = fc.State
	if fc.StateTimeout != 0 {
		s.stateTimeout = time.Duration(fc.StateTimeout)
		if s.stateTimeout < 100*time.Millisecond || s.stateTimeout > time.Minute {
			errs = append(errs, &ConfigError{Field: "state_timeout", Msg: fmt.Sprintf(
				"state_timeout %s is outside 100ms to 1m: it bounds how long a call waits for the database before it fails with stateUnavailable", s.stateTimeout)})
		}
	}
	if fc.BodyMemoryMiB != 0 {
		if fc.BodyMemoryMiB < 16 || fc.BodyMemoryMiB > 1<<20 {
			errs = append(errs, &ConfigError{Field: "body_memory_mib", Msg: fmt.Sprintf(
				"body_memory_mib %d is outside 16 to 1048576: it bounds, in MiB, the memory that request and answer bodies in flight take across all callers (at least one fetch's 8 MiB and then some)",
				fc.BodyMemoryMiB)})
		}
		s.bodyMemory = fc.BodyMemoryMiB << 20
	}
	if (fc.TLSCert == "") != (fc.TLSKey == "") {
		errs = append(errs, &ConfigError{Field: "tls_cert", Msg: "tls_cert and tls_key go together: set both (the certificate and its private key, PEM files), or neither"})
	}
	s.tlsCert, s.tlsKey = fc.TLSCert, fc.TLSKey
	return errs
}

// checkState refuses a state location that CheckState refuses, such as
// one with a password in it: a config file is no place for a credential.
func (e Env) checkState(location string) *ConfigError {
	if e.CheckState == nil || location == "" {
		return nil
	}
	if err := e.CheckState(location); err != nil {
		return &ConfigError{Field: "state", Msg: "the state " + err.Error()}
	}
	return nil
}

// located gives each error the line of its field and returns one error
// or all of them, in the order of the file.
func located(errs []*ConfigError, lines fieldLines) error {
	for _, e := range errs {
		if e.Line == 0 {
			e.Line = lines.line(e.Field)
		}
	}
	slices.SortStableFunc(errs, func(a, b *ConfigError) int { return a.Line - b.Line })
	if len(errs) == 1 {
		return errs[0]
	}
	return ConfigErrors(errs)
}

var keyName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// key checks a [[keys]] entry and returns the key, or every mistake in it
// (fields relative to the entry).
func (kc keyConfig) key(env Env) (*Key, []*ConfigError) {
	var errs []*ConfigError
	bad := func(field, msg string) { errs = append(errs, &ConfigError{Field: field, Msg: msg}) }
	if !keyName.MatchString(kc.Name) {
		bad("name", fmt.Sprintf("%q is not a valid key name: use 1 to 64 letters, digits, '.', '_' or '-'", kc.Name))
	}
	if kc.Secret != nil {
		bad("secret", "secrets are never written in the configuration: use secret_env or secret_file")
	}
	k := &Key{
		Name:           kc.Name,
		AllowHosts:     kc.AllowHosts,
		MaxRate:        DefaultMaxRate,
		MaxConcurrency: DefaultMaxConcurrency,
		LowWater:       DefaultLowWater,
	}
	kc.upstream(k, env, bad)
	kc.policies(k, bad)
	checkKeyScopes(kc, bad)
	k.Scopes, k.WriteScopes = kc.Scopes, kc.WriteScopes
	kc.requests(k, bad)
	kc.reserves(k, bad)
	k.Shares = parseShares(kc.Share, bad)
	kc.limits(k, bad)
	if len(errs) > 0 {
		return nil, errs
	}
	return k, nil
}

// upstream sets where k's calls go, how they authenticate, the profile
// its answers are read by, and its credential.
func (kc keyConfig) upstream(k *Key, env Env, bad func(field, msg string)) {
	u, err := url.Parse(kc.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		bad("base_url", fmt.Sprintf("%q is not an absolute http(s) URL without credentials, query or fragment", kc.BaseURL))
	} else {
		if !strings.HasSuffix(u.Path, "/") {
			u.Path += "/"
		}
		u.RawPath = ""
		k.BaseURL = u
	}
	authKnown := true
	if k.Auth, err = parseAuth(kc.Auth); err != nil {
		bad("auth", err.Error())
		authKnown = false
	}
	if k.Profile, err = ratelimit.ParseProfile(kc.Profile); err != nil {
		msg := err.Error()
		if best := spelling.Closest(strings.ToLower(strings.TrimSpace(kc.Profile)), profileNames()); best != "" {
			msg += ": did you mean " + best + "?"
		}
		bad("profile", msg)
	}
	switch {
	case kc.SecretEnv != "" && kc.SecretFile != "":
		bad("secret_env", "set secret_env or secret_file, not both")
	case kc.SecretEnv != "":
		if v := strings.TrimSpace(env.getenv(kc.SecretEnv)); v != "" {
			k.secret = NewSecret(v)
		} else {
			k.secretErr = fmt.Errorf("%w: environment variable %s is not set", ErrNoCredential, kc.SecretEnv)
		}
	case kc.SecretFile != "":
		if b, err := env.readFile(kc.SecretFile); err != nil {
			k.secretErr = fmt.Errorf("%w: cannot read secret_file %s", ErrNoCredential, kc.SecretFile)
		} else if v := strings.TrimSpace(string(b)); v == "" {
			k.secretErr = fmt.Errorf("%w: secret_file %s is empty", ErrNoCredential, kc.SecretFile)
		} else {
			k.secret = NewSecret(v)
		}
	case k.Auth.Kind != AuthNone && kc.Secret == nil && authKnown:
		bad("secret_env", fmt.Sprintf("auth %q needs a credential: set secret_env or secret_file (or auth = \"none\")", k.Auth))
	}
	k.scrub = NewScrubber(k.secret.Reveal())
}

// policies adds the documented [[keys.policies]] to k.
func (kc keyConfig) policies(k *Key, bad func(field, msg string)) {
	for j, pc := range kc.Policies {
		if pc.Name == "" {
			pc.Name = "default"
		}
		field := func(name string) string { return fmt.Sprintf("policies[%d].%s", j, name) }
		ok := true
		if pc.Quota <= 0 {
			bad(field("quota"), "quota must be a positive number of units")
			ok = false
		}
		unit, err := policyUnit(pc.Unit)
		if err != nil {
			bad(field("unit"), err.Error())
			ok = false
		}
		switch {
		case unit == ratelimit.ConcurrentRequests && pc.Window != 0:
			bad(field("window"), "a policy in concurrent-requests counts the calls in flight, over no window: leave window out")
			ok = false
		case unit != ratelimit.ConcurrentRequests && pc.Window <= 0:
			bad(field("window"), "window is required, e.g. \"60s\"")
			ok = false
		}
		if slices.ContainsFunc(k.Policies, func(p Policy) bool { return p.Name == pc.Name }) {
			bad(field("name"), fmt.Sprintf("policy %q is configured twice", pc.Name))
			ok = false
		}
		if ok {
			k.Policies = append(k.Policies, Policy{Name: pc.Name, Quota: pc.Quota, Window: time.Duration(pc.Window), Unit: unit})
		}
	}
}

// policyUnit reads a documented policy's unit; requests when unset.
func policyUnit(s string) (ratelimit.Unit, error) {
	switch ratelimit.Unit(s) {
	case "", ratelimit.Requests:
		return ratelimit.Requests, nil
	case ratelimit.ContentBytes, ratelimit.ConcurrentRequests:
		return ratelimit.Unit(s), nil
	}
	msg := fmt.Sprintf("unit %q is not enforced locally; use \"requests\", \"content-bytes\" or \"concurrent-requests\"", s)
	if best := spelling.Closest(strings.ToLower(strings.TrimSpace(s)), []string{"requests", "content-bytes", "concurrent-requests"}); best != "" {
		msg += ": did you mean " + best + "?"
	}
	return ratelimit.Requests, errors.New(msg)
}

// requests sets the methods k forwards and checks the hosts it may reach
// besides its base URL's.
func (kc keyConfig) requests(k *Key, bad func(field, msg string)) {
	k.Methods = []string{"GET", "HEAD"}
	if kc.Methods != nil {
		k.Methods = nil
		for _, m := range kc.Methods {
			m = strings.ToUpper(m)
			if !slices.Contains([]string{"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"}, m) {
				bad("methods", fmt.Sprintf("%q is not an HTTP method mcp-quota forwards", m))
				continue
			}
			k.Methods = append(k.Methods, m)
		}
	}
	for j, h := range kc.AllowHosts {
		if h == "" || strings.ContainsAny(h, "/@?# ") {
			bad(fmt.Sprintf("allow_hosts[%d]", j), fmt.Sprintf("%q is not a host name (host or host:port)", h))
		}
	}
}

// reserves adds the [[keys.reserve]] shares to k.
func (kc keyConfig) reserves(k *Key, bad func(field, msg string)) {
	var shares float64
	for j, rc := range kc.Reserve {
		if rc.Caller == "" || rc.Share <= 0 || rc.Share >= 1 {
			bad(fmt.Sprintf("reserve[%d]", j), "a reserve needs a caller and a share between 0 and 1, e.g. share = 0.2")
			continue
		}
		shares += rc.Share
		k.Reserves = append(k.Reserves, Reserve(rc))
	}
	if shares >= 1 {
		bad("reserve", "reserved shares add up to 1 or more: leave something for the other callers")
	}
}

// limits sets k's local rate, concurrency and low-water mark, where the
// entry sets them.
func (kc keyConfig) limits(k *Key, bad func(field, msg string)) {
	if kc.MaxRate != nil {
		if *kc.MaxRate <= 0 || math.IsInf(*kc.MaxRate, 0) {
			bad("max_rate", "max_rate must be a positive number of calls per second")
		} else {
			k.MaxRate = *kc.MaxRate
		}
	}
	if kc.MaxConcurrency != nil {
		if *kc.MaxConcurrency <= 0 {
			bad("max_concurrency", "max_concurrency must be at least 1")
		} else {
			k.MaxConcurrency = *kc.MaxConcurrency
		}
	}
	k.UnreachableHint = strings.TrimSpace(kc.Unreachable)
	if kc.LowWater != nil {
		if *kc.LowWater < 0 || *kc.LowWater >= 1 {
			bad("low_water", "low_water is a share of the quota, between 0 and 1")
		} else {
			k.LowWater = *kc.LowWater
		}
	}
}

func parseAuth(s string) (Auth, error) {
	kind, name, _ := strings.Cut(s, ":")
	switch AuthKind(kind) {
	case "", AuthBearer:
		if name == "" {
			return Auth{Kind: AuthBearer}, nil
		}
	case AuthNone:
		if name == "" {
			return Auth{Kind: AuthNone}, nil
		}
	case AuthHeader, AuthQuery:
		if validToken(name) {
			return Auth{Kind: AuthKind(kind), Name: name}, nil
		}
	}
	return Auth{}, fmt.Errorf("%q is not one of bearer, header:NAME, query:NAME, none", s)
}

// validToken reports whether s is an HTTP token (RFC 9110 §5.6.2).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c > 127 || !(c == '-' || c == '_' || c == '.' || c == '!' || c == '#' || c == '$' || c == '%' || c == '&' ||
			c == '\'' || c == '*' || c == '+' || c == '^' || c == '`' || c == '|' || c == '~' ||
			('0' <= c && c <= '9') || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')) {
			return false
		}
	}
	return true
}

// caller checks a [[callers]] entry against the keys the file declares
// and returns the caller, or every mistake in it.
func (cc callerConfig) caller(env Env, keys map[string]bool) (*Caller, []*ConfigError) {
	var errs []*ConfigError
	bad := func(field, msg string) { errs = append(errs, &ConfigError{Field: field, Msg: msg}) }
	if !keyName.MatchString(cc.Name) {
		bad("name", fmt.Sprintf("%q is not a valid caller name", cc.Name))
	}
	c := &Caller{Name: cc.Name, Keys: cc.Keys, visibleTo: cc.VisibleTo}
	for j, v := range cc.VisibleTo {
		if msg := badViewer(v); msg != "" {
			bad(fmt.Sprintf("visible_to[%d]", j), msg)
		}
	}
	var v string
	tokenField := "token_env"
	switch {
	case env.NoCallerTokens:
	case cc.TokenEnv != "" && cc.TokenFile != "":
		bad("token_env", "set token_env or token_file, not both")
	case cc.TokenEnv != "":
		if v = strings.TrimSpace(env.getenv(cc.TokenEnv)); v == "" {
			bad("token_env", fmt.Sprintf("environment variable %s is not set", cc.TokenEnv))
		}
	case cc.TokenFile != "":
		tokenField = "token_file"
		b, err := env.readFile(cc.TokenFile)
		if err != nil {
			bad("token_file", fmt.Sprintf("cannot read %s", cc.TokenFile))
		} else if v = strings.TrimSpace(string(b)); v == "" {
			bad("token_file", fmt.Sprintf("%s is empty", cc.TokenFile))
		}
	default:
		bad("token_env", "a caller needs a token: set token_env or token_file")
	}
	if v != "" && len(v) < 16 {
		bad(tokenField, "the caller's token is shorter than 16 characters: use a long random token")
	}
	c.token = NewSecret(v)
	for j, name := range cc.Keys {
		if name != "*" && !keys[name] {
			bad(fmt.Sprintf("keys[%d]", j), fmt.Sprintf("key %q is not configured", name))
		}
	}
	if len(cc.Keys) == 0 {
		bad("keys", "list the keys this caller may use, e.g. keys = [\"example\"] (or [\"*\"])")
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return c, nil
}

// profileNames are the names a key's profile may take.
func profileNames() []string {
	var names []string
	for _, p := range ratelimit.Profiles() {
		names = append(names, string(p))
	}
	return names
}
