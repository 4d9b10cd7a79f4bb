package keystore

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
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
	Keys    []keyConfig    `toml:"keys"`
	Callers []callerConfig `toml:"callers"`
}

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
	MaxRate        *float64        `toml:"max_rate"`
	MaxConcurrency *int            `toml:"max_concurrency"`
	LowWater       *float64        `toml:"low_water"`
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
	Line  int    // 1-based; 0 when unknown
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

// Load reads the configuration file at path. A missing file is reported
// with an error satisfying errors.Is(err, fs.ErrNotExist).
func Load(path string, env Env) (*Store, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s, err := Parse(data, env)
	var ce *ConfigError
	if errors.As(err, &ce) {
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
// Mistakes are reported as a *ConfigError naming the line and the field.
// A key whose credential cannot be read is kept: calls through it fail
// with ErrNoCredential, so one missing variable does not stop the rest.
func Parse(data []byte, env Env) (*Store, error) {
	var fc fileConfig
	md, err := toml.Decode(string(data), &fc)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, &ConfigError{Line: pe.Position.Line, Field: pe.LastKey, Msg: pe.Message}
		}
		return nil, &ConfigError{Msg: err.Error()}
	}
	if undecoded := md.Undecoded(); len(undecoded) > 0 {
		k := undecoded[0].String()
		last := undecoded[0][len(undecoded[0])-1]
		return nil, &ConfigError{Line: lineOfField(data, last), Field: k, Msg: "unknown field (check its spelling)"}
	}
	lines := sectionLines(data)
	s := &Store{}
	for i, kc := range fc.Keys {
		at := lines["keys"].at(i)
		k, err := kc.key(env)
		if err != nil {
			err.Field = fmt.Sprintf("keys[%d].%s", i, err.Field)
			if err.Line == 0 {
				err.Line = at
			}
			return nil, err
		}
		if slices.ContainsFunc(s.keys, func(o *Key) bool { return o.Name == k.Name }) {
			return nil, &ConfigError{Line: at, Field: fmt.Sprintf("keys[%d].name", i), Msg: fmt.Sprintf("key %q is configured twice", k.Name)}
		}
		s.keys = append(s.keys, k)
	}
	for i, cc := range fc.Callers {
		at := lines["callers"].at(i)
		c, err := cc.caller(env, s)
		if err != nil {
			err.Field = fmt.Sprintf("callers[%d].%s", i, err.Field)
			err.Line = at
			return nil, err
		}
		if slices.ContainsFunc(s.callers, func(o *Caller) bool { return o.Name == c.Name }) {
			return nil, &ConfigError{Line: at, Field: fmt.Sprintf("callers[%d].name", i), Msg: fmt.Sprintf("caller %q is configured twice", c.Name)}
		}
		s.callers = append(s.callers, c)
	}
	return s, nil
}

var keyName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

func (kc keyConfig) key(env Env) (*Key, *ConfigError) {
	if !keyName.MatchString(kc.Name) {
		return nil, &ConfigError{Field: "name", Msg: fmt.Sprintf("%q is not a valid key name: use 1 to 64 letters, digits, '.', '_' or '-'", kc.Name)}
	}
	if kc.Secret != nil {
		return nil, &ConfigError{Field: "secret", Msg: "secrets are never written in the configuration: use secret_env or secret_file"}
	}
	u, err := url.Parse(kc.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, &ConfigError{Field: "base_url", Msg: fmt.Sprintf("%q is not an absolute http(s) URL without credentials, query or fragment", kc.BaseURL)}
	}
	if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
	}
	u.RawPath = ""
	k := &Key{
		Name:           kc.Name,
		BaseURL:        u,
		AllowHosts:     kc.AllowHosts,
		MaxRate:        DefaultMaxRate,
		MaxConcurrency: DefaultMaxConcurrency,
		LowWater:       DefaultLowWater,
	}
	if k.Auth, err = parseAuth(kc.Auth); err != nil {
		return nil, &ConfigError{Field: "auth", Msg: err.Error()}
	}
	if k.Profile, err = ratelimit.ParseProfile(kc.Profile); err != nil {
		return nil, &ConfigError{Field: "profile", Msg: err.Error()}
	}
	switch {
	case kc.SecretEnv != "" && kc.SecretFile != "":
		return nil, &ConfigError{Field: "secret_env", Msg: "set secret_env or secret_file, not both"}
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
	case k.Auth.Kind != AuthNone:
		return nil, &ConfigError{Field: "secret_env", Msg: fmt.Sprintf("auth %q needs a credential: set secret_env or secret_file (or auth = \"none\")", k.Auth)}
	}
	k.scrub = NewScrubber(k.secret.Reveal())
	for j, pc := range kc.Policies {
		if pc.Name == "" {
			pc.Name = "default"
		}
		if pc.Quota <= 0 {
			return nil, &ConfigError{Field: fmt.Sprintf("policies[%d].quota", j), Msg: "quota must be a positive number of units"}
		}
		if pc.Window <= 0 {
			return nil, &ConfigError{Field: fmt.Sprintf("policies[%d].window", j), Msg: "window is required, e.g. \"60s\""}
		}
		unit := ratelimit.Requests
		if pc.Unit != "" && pc.Unit != string(ratelimit.Requests) {
			return nil, &ConfigError{Field: fmt.Sprintf("policies[%d].unit", j), Msg: fmt.Sprintf("unit %q is not enforced locally; only \"requests\" is", pc.Unit)}
		}
		if slices.ContainsFunc(k.Policies, func(p Policy) bool { return p.Name == pc.Name }) {
			return nil, &ConfigError{Field: fmt.Sprintf("policies[%d].name", j), Msg: fmt.Sprintf("policy %q is configured twice", pc.Name)}
		}
		k.Policies = append(k.Policies, Policy{Name: pc.Name, Quota: pc.Quota, Window: time.Duration(pc.Window), Unit: unit})
	}
	k.Methods = []string{"GET", "HEAD"}
	if kc.Methods != nil {
		k.Methods = nil
		for _, m := range kc.Methods {
			m = strings.ToUpper(m)
			if !slices.Contains([]string{"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"}, m) {
				return nil, &ConfigError{Field: "methods", Msg: fmt.Sprintf("%q is not an HTTP method mcp-quota forwards", m)}
			}
			k.Methods = append(k.Methods, m)
		}
	}
	for j, h := range kc.AllowHosts {
		if h == "" || strings.ContainsAny(h, "/@?# ") {
			return nil, &ConfigError{Field: fmt.Sprintf("allow_hosts[%d]", j), Msg: fmt.Sprintf("%q is not a host name (host or host:port)", h)}
		}
	}
	var shares float64
	for j, rc := range kc.Reserve {
		if rc.Caller == "" || rc.Share <= 0 || rc.Share >= 1 {
			return nil, &ConfigError{Field: fmt.Sprintf("reserve[%d]", j), Msg: "a reserve needs a caller and a share between 0 and 1, e.g. share = 0.2"}
		}
		shares += rc.Share
		k.Reserves = append(k.Reserves, Reserve(rc))
	}
	if shares >= 1 {
		return nil, &ConfigError{Field: "reserve", Msg: "reserved shares add up to 1 or more: leave something for the other callers"}
	}
	if kc.MaxRate != nil {
		if *kc.MaxRate <= 0 || math.IsInf(*kc.MaxRate, 0) {
			return nil, &ConfigError{Field: "max_rate", Msg: "max_rate must be a positive number of calls per second"}
		}
		k.MaxRate = *kc.MaxRate
	}
	if kc.MaxConcurrency != nil {
		if *kc.MaxConcurrency <= 0 {
			return nil, &ConfigError{Field: "max_concurrency", Msg: "max_concurrency must be at least 1"}
		}
		k.MaxConcurrency = *kc.MaxConcurrency
	}
	if kc.LowWater != nil {
		if *kc.LowWater < 0 || *kc.LowWater >= 1 {
			return nil, &ConfigError{Field: "low_water", Msg: "low_water is a share of the quota, between 0 and 1"}
		}
		k.LowWater = *kc.LowWater
	}
	return k, nil
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

func (cc callerConfig) caller(env Env, s *Store) (*Caller, *ConfigError) {
	if !keyName.MatchString(cc.Name) {
		return nil, &ConfigError{Field: "name", Msg: fmt.Sprintf("%q is not a valid caller name", cc.Name)}
	}
	c := &Caller{Name: cc.Name, Keys: cc.Keys}
	var v string
	switch {
	case cc.TokenEnv != "" && cc.TokenFile != "":
		return nil, &ConfigError{Field: "token_env", Msg: "set token_env or token_file, not both"}
	case cc.TokenEnv != "":
		if v = strings.TrimSpace(env.getenv(cc.TokenEnv)); v == "" {
			return nil, &ConfigError{Field: "token_env", Msg: fmt.Sprintf("environment variable %s is not set", cc.TokenEnv)}
		}
	case cc.TokenFile != "":
		b, err := env.readFile(cc.TokenFile)
		if err != nil {
			return nil, &ConfigError{Field: "token_file", Msg: fmt.Sprintf("cannot read %s", cc.TokenFile)}
		}
		if v = strings.TrimSpace(string(b)); v == "" {
			return nil, &ConfigError{Field: "token_file", Msg: fmt.Sprintf("%s is empty", cc.TokenFile)}
		}
	default:
		return nil, &ConfigError{Field: "token_env", Msg: "a caller needs a token: set token_env or token_file"}
	}
	if len(v) < 16 {
		return nil, &ConfigError{Field: "token_env", Msg: "the caller's token is shorter than 16 characters: use a long random token"}
	}
	c.token = NewSecret(v)
	for j, name := range cc.Keys {
		if name == "*" {
			continue
		}
		if _, err := s.Key(name); err != nil {
			return nil, &ConfigError{Field: fmt.Sprintf("keys[%d]", j), Msg: fmt.Sprintf("key %q is not configured", name)}
		}
	}
	if len(cc.Keys) == 0 {
		return nil, &ConfigError{Field: "keys", Msg: "list the keys this caller may use, e.g. keys = [\"example\"] (or [\"*\"])"}
	}
	return c, nil
}

// sections maps an array-of-tables name to the lines of its headers.
type sectionLine []int

func (l sectionLine) at(i int) int {
	if i < len(l) {
		return l[i]
	}
	return 0
}

var arrayHeader = regexp.MustCompile(`^\s*\[\[\s*([A-Za-z_.]+)\s*\]\]`)

// sectionLines finds the line of each [[keys]] and [[callers]] header, so
// errors about the i-th entry can name its line.
func sectionLines(data []byte) map[string]sectionLine {
	out := map[string]sectionLine{}
	for n, line := range strings.Split(string(data), "\n") {
		if m := arrayHeader.FindStringSubmatch(line); m != nil {
			out[m[1]] = append(out[m[1]], n+1)
		}
	}
	return out
}

// lineOfField finds the first line that assigns field, for errors about
// unknown fields; 0 when not found.
func lineOfField(data []byte, field string) int {
	re := regexp.MustCompile(`^\s*"?` + regexp.QuoteMeta(field) + `"?\s*=`)
	for n, line := range strings.Split(string(data), "\n") {
		if re.MatchString(line) {
			return n + 1
		}
	}
	return 0
}
