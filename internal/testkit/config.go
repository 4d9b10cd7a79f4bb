package testkit

import (
	"fmt"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Config is the part of a configuration file a test writes — its state,
// keys, callers, [oauth] table and principals — built as Go values instead of TOML pasted as text. TOML writes
// it as the text keystore.Parse reads.
//
// A string may hold a fmt verb for the test to fill in afterwards (a
// BaseURL of "%[1]s/api/" becomes, after TOML, "\"%[1]s/api/\"", which
// fmt.Sprintf fills with the upstream's URL); anything else is written as
// given, quoted where TOML wants it.
type Config struct {
	State        string        // a state file or a PostgreSQL URL; "" leaves the command line's
	StateTimeout time.Duration // zero leaves the default
	Keys         []Key
	Callers      []Caller
	OAuth        *OAuth // nil: no [oauth] table
	Principals   []Principal
}

// Key is one [[keys]] table. A zero field is left out of the file, so the
// configuration's default applies (auth "bearer", no max_rate, …).
type Key struct {
	Name           string
	BaseURL        string
	SecretEnv      string
	SecretFile     string
	Auth           string
	Profile        string
	AllowHosts     []string
	Methods        []string
	MaxRate        float64
	MaxConcurrency int
	LowWater       float64
	Scopes         []string
	WriteScopes    []string
	Policies       []Policy
	Reserve        []Reserve
	Shares         []Share
}

// Policy is one [[keys.policies]] table: Quota calls (or Unit) per Window.
type Policy struct {
	Name   string
	Quota  int64
	Window time.Duration
	Unit   string
}

// Reserve is one entry of a key's reserve: Share of the budget kept for
// Caller.
type Reserve struct {
	Caller string
	Share  float64
}

// Share is one [[keys.share]] table: the most of the budget Principal
// ("*" for each principal not named) may take.
type Share struct {
	Principal string
	Share     float64
}

// Caller is one [[callers]] table.
type Caller struct {
	Name      string
	TokenEnv  string
	TokenFile string
	Keys      []string
	VisibleTo []string
}

// OAuth is the [oauth] table, with the fields the tests set.
type OAuth struct {
	Issuer                 string
	Resource               string
	Scopes                 []string
	IntrospectionClientID  string
	IntrospectionSecretEnv string
	Contact                string
	DashboardClientID      string
	IssuerName             string
	AdminGroup             string
}

// Principal is one [[principals]] table: the people or jobs whose claim
// has one of values, and the keys they may use.
type Principal struct {
	Name      string
	Claim     string
	Values    []string
	Keys      []string
	VisibleTo []string
}

// Window is the one policy most tests give a key: quota calls per window.
func Window(quota int64, window time.Duration) []Policy {
	return []Policy{{Quota: quota, Window: window}}
}

// TOML returns c as a configuration file's text.
func (c Config) TOML() string {
	f := fileTOML{State: c.State, StateTimeout: durationText(c.StateTimeout)}
	for _, k := range c.Keys {
		kt := keyTOML{Name: k.Name, BaseURL: k.BaseURL, SecretEnv: k.SecretEnv, SecretFile: k.SecretFile,
			Auth: k.Auth, Profile: k.Profile, AllowHosts: k.AllowHosts, Methods: k.Methods, MaxRate: k.MaxRate,
			MaxConcurrency: k.MaxConcurrency, LowWater: k.LowWater, Scopes: k.Scopes, WriteScopes: k.WriteScopes}
		for _, p := range k.Policies {
			kt.Policies = append(kt.Policies, policyTOML{Name: p.Name, Quota: p.Quota, Window: durationText(p.Window), Unit: p.Unit})
		}
		for _, r := range k.Reserve {
			kt.Reserve = append(kt.Reserve, reserveTOML(r))
		}
		for _, sh := range k.Shares {
			kt.Shares = append(kt.Shares, shareTOML(sh))
		}
		f.Keys = append(f.Keys, kt)
	}
	for _, c := range c.Callers {
		f.Callers = append(f.Callers, callerTOML(c))
	}
	if c.OAuth != nil {
		o := oauthTOML(*c.OAuth)
		f.OAuth = &o
	}
	for _, p := range c.Principals {
		f.Principals = append(f.Principals, principalTOML(p))
	}
	var b strings.Builder
	if err := toml.NewEncoder(&b).Encode(f); err != nil {
		panic(fmt.Sprintf("testkit: a configuration that TOML cannot write: %v", err)) // only plain values above
	}
	return b.String()
}

// Keys returns keys alone as a configuration file's [[keys]] tables.
func Keys(keys ...Key) string { return Config{Keys: keys}.TOML() }

// durationText writes d as the configuration writes durations: "60s",
// "100ms".
func durationText(d time.Duration) string {
	if d == 0 {
		return ""
	}
	if d%time.Second == 0 {
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return d.String()
}

type fileTOML struct {
	State        string          `toml:"state,omitempty"`
	StateTimeout string          `toml:"state_timeout,omitempty"`
	Keys         []keyTOML       `toml:"keys,omitempty"`
	Callers      []callerTOML    `toml:"callers,omitempty"`
	OAuth        *oauthTOML      `toml:"oauth,omitempty"`
	Principals   []principalTOML `toml:"principals,omitempty"`
}

type oauthTOML struct {
	Issuer                 string   `toml:"issuer,omitempty"`
	Resource               string   `toml:"resource,omitempty"`
	Scopes                 []string `toml:"scopes,omitempty"`
	IntrospectionClientID  string   `toml:"introspection_client_id,omitempty"`
	IntrospectionSecretEnv string   `toml:"introspection_secret_env,omitempty"`
	Contact                string   `toml:"contact,omitempty"`
	DashboardClientID      string   `toml:"dashboard_client_id,omitempty"`
	IssuerName             string   `toml:"issuer_name,omitempty"`
	AdminGroup             string   `toml:"admin_group,omitempty"`
}

type principalTOML struct {
	Name      string   `toml:"name,omitempty"`
	Claim     string   `toml:"claim,omitempty"`
	Values    []string `toml:"values,omitempty"`
	Keys      []string `toml:"keys,omitempty"`
	VisibleTo []string `toml:"visible_to,omitempty"`
}

type keyTOML struct {
	Name           string        `toml:"name,omitempty"`
	BaseURL        string        `toml:"base_url,omitempty"`
	SecretEnv      string        `toml:"secret_env,omitempty"`
	SecretFile     string        `toml:"secret_file,omitempty"`
	Auth           string        `toml:"auth,omitempty"`
	Profile        string        `toml:"profile,omitempty"`
	AllowHosts     []string      `toml:"allow_hosts,omitempty"`
	Methods        []string      `toml:"methods,omitempty"`
	MaxRate        float64       `toml:"max_rate,omitzero"`
	MaxConcurrency int           `toml:"max_concurrency,omitzero"`
	LowWater       float64       `toml:"low_water,omitzero"`
	Scopes         []string      `toml:"scopes,omitempty"`
	WriteScopes    []string      `toml:"write_scopes,omitempty"`
	Policies       []policyTOML  `toml:"policies,omitempty"`
	Reserve        []reserveTOML `toml:"reserve,omitempty"`
	Shares         []shareTOML   `toml:"share,omitempty"`
}

type reserveTOML struct {
	Caller string  `toml:"caller"`
	Share  float64 `toml:"share"`
}

type shareTOML struct {
	Principal string  `toml:"principal"`
	Share     float64 `toml:"share"`
}

type policyTOML struct {
	Name   string `toml:"name,omitempty"`
	Quota  int64  `toml:"quota,omitzero"`
	Window string `toml:"window,omitempty"`
	Unit   string `toml:"unit,omitempty"`
}

type callerTOML struct {
	Name      string   `toml:"name,omitempty"`
	TokenEnv  string   `toml:"token_env,omitempty"`
	TokenFile string   `toml:"token_file,omitempty"`
	Keys      []string `toml:"keys,omitempty"`
	VisibleTo []string `toml:"visible_to,omitempty"`
}
