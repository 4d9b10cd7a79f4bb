package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report"
	"github.com/mcp-quota/mcp-quota/state"
)

// status prints every key's budget from the state file: a table, or JSON
// (the shape of quota_status and GET /v1/quota) with --json.
func (e environment) status(ctx context.Context, args []string) error {
	var c common
	fs := e.flags("status", &c, "warn")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	only := fs.String("key", "", "show only this key")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	log, err := e.logger(c)
	if err != nil {
		return err
	}
	keys, err := e.loadKeys(c, log, keysToRead)
	if err != nil {
		return err
	}
	list, err := statusKeys(keys, *only)
	if err != nil {
		return err
	}
	a, err := e.open(ctx, c, keys, log, false)
	if err != nil {
		return err
	}
	defer a.close()
	now := a.clock.Now()
	st, err := report.Build(ctx, a.pacer, list, nil, now)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(st); err != nil {
			return err
		}
		return unusableKeys(st)
	}
	if len(st.Keys) == 0 {
		fmt.Fprintf(e.stdout, "no keys are configured (%s)%s\n", e.configPath(c), e.demoConfigHint(c))
		return nil
	}
	printStatusTable(e.stdout, st)
	printStatusNotes(e.stdout, st)
	return unusableKeys(st)
}

// unusableKeys is status's error (and exit status 1) when a key it shows
// cannot be used, its credential unavailable in this environment, so that
// "check it with mcp-quota status" after init fails where the key would;
// nil when every key can be.
func unusableKeys(st report.Status) error {
	var names []string
	for _, k := range st.Keys {
		if k.Credential != "ok" {
			names = append(names, k.Key)
		}
	}
	if len(names) == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d keys cannot be used here, their credential unavailable (see above): %s",
		len(names), len(st.Keys), strings.Join(names, ", "))
}

// demoConfigHint points status, finding no keys, at the demo's
// configuration when the demo's folder beside the state has one: a
// newcomer who runs status beside "serve --demo" without --config.
func (e environment) demoConfigHint(c common) string {
	if c.config != "" {
		return ""
	}
	dir, err := e.demoDirPath(c)
	if err != nil {
		return ""
	}
	path := filepath.Join(dir, "config.toml")
	if _, err := os.Stat(path); err != nil {
		return ""
	}
	where := ""
	switch {
	case state.IsPostgres(c.state): // never with a password: parse refuses one
		where = " --state " + shellQuote(c.state)
	case c.state != "":
		where = " --state " + shellQuote(absPath(c.state)) // from any folder
	}
	return fmt.Sprintf("; the demo's key (mcp-quota serve --demo) is in its own: mcp-quota status --config %s%s", shellQuote(path), where)
}

// statusKeys is the keys status shows: every key, or only the one named.
func statusKeys(keys *keystore.Store, only string) ([]*keystore.Key, error) {
	if only == "" {
		return keys.Keys(), nil
	}
	k, err := keys.Key(only)
	if err != nil {
		return nil, err
	}
	return []*keystore.Key{k}, nil
}

// printStatusTable writes a row to w for each policy of each key of st,
// its own (local) and those the upstream announced, and a row of dashes
// for a key that has none.
func printStatusTable(w io.Writer, st report.Status) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tPOLICY\tSOURCE\tLIMIT\tREMAINING\tRESET\tWINDOW\tAGE\tBINDS\t")
	for _, k := range st.Keys {
		for _, l := range k.Local {
			fmt.Fprintf(tw, "%s\t%s\tlocal\t%d\t%d\t%ds\t%ds\t-\t%s\t\n", k.Key, l.Policy, l.Limit, l.Remaining, l.ResetS, l.WindowS, yes(l.Binds))
		}
		for _, u := range k.Upstream {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%ds\t%ds\t%ds\t%s\t\n", k.Key, upstreamName(u), u.Source, u.Q, upstreamRemaining(u), u.T, u.W, u.AgeS, yes(u.Binds))
		}
		if len(k.Local) == 0 && len(k.Upstream) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\t-\t\n", k.Key)
		}
	}
	tw.Flush()
}

// upstreamName is how the table names a policy the upstream announced:
// with its partition, and marked when it was hidden.
func upstreamName(u report.Upstream) string {
	name := u.Policy
	if u.Partition != "" {
		name += "/" + u.Partition
	}
	if u.Hidden {
		name += " (hidden)"
	}
	return name
}

// upstreamRemaining is the table's REMAINING of a policy the upstream
// announced: "expired" once its reading is too old, "?" when unknown.
func upstreamRemaining(u report.Upstream) string {
	switch {
	case u.Expired:
		return "expired"
	case u.R < 0:
		return "?"
	}
	return fmt.Sprint(u.R)
}

// printStatusNotes writes to w, for each key of st, its advice, the gate
// that closes it, a credential that is not ok and its warnings.
func printStatusNotes(w io.Writer, st report.Status) {
	for _, k := range st.Keys {
		fmt.Fprintf(w, "%s: %s: %s\n", k.Key, k.Advice.Action, k.Advice.Reason)
		if g := k.RetryAfter; g != nil {
			fmt.Fprintf(w, "%s: closed for %ds (%s): %s\n", k.Key, g.RetryAfterS, g.Source, g.Reason)
		}
		if k.Credential != "ok" {
			fmt.Fprintf(w, "%s: credential: %s\n", k.Key, k.Credential)
		}
		for _, warning := range k.Warnings {
			fmt.Fprintf(w, "%s: warning: %s\n", k.Key, warning)
		}
	}
}

// yes marks the budget that binds in the status table.
func yes(on bool) string {
	if on {
		return "yes"
	}
	return ""
}

// activity prints the latest attempts from the state file.
func (e environment) activity(ctx context.Context, args []string) error {
	var c common
	fs := e.flags("activity", &c, "warn")
	asJSON := fs.Bool("json", false, "print JSON lines instead of a table")
	key := fs.String("key", "", "show only this key")
	limit := fs.Int("limit", 30, "how many attempts")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	log, err := e.logger(c)
	if err != nil {
		return err
	}
	keys, err := e.loadKeys(c, log, keysToRead) // for the state it names
	if err != nil {
		return err
	}
	a, _, err := e.openState(ctx, c, keys, log, false)
	if err != nil {
		return err
	}
	defer a.Close()
	var list []ledger.Attempt
	err = a.View(ctx, func(tx ledger.ReadTx) error {
		var err error
		list, err = tx.Activity(ledger.ActivityFilter{Key: *key, Limit: *limit})
		return err
	})
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		for _, at := range list {
			if err := enc.Encode(report.NewActivity(at)); err != nil {
				return err
			}
		}
		return nil
	}
	// The instance that recorded each attempt is a column once there are
	// several (hosts sharing a PostgreSQL state, processes one file).
	instances := map[string]bool{}
	for _, at := range list {
		instances[at.Instance] = true
	}
	tw := tabwriter.NewWriter(e.stdout, 2, 4, 2, ' ', 0)
	if len(instances) > 1 {
		fmt.Fprint(tw, "INSTANCE\t")
	}
	fmt.Fprintln(tw, "TIME\tKEY\tCALLER\tTRANSPORT\tREQUEST\tSTATE\tSTATUS\tWAIT\tREASON\t")
	for _, at := range list {
		status := "-"
		if at.Status > 0 {
			status = fmt.Sprint(at.Status)
		}
		if len(instances) > 1 {
			fmt.Fprintf(tw, "%s\t", at.Instance)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s %s\t%s\t%s\t%s\t%s\t\n", at.At.Local().Format("15:04:05.000"), at.Key, at.Caller,
			at.Transport, at.Method, at.Target, at.State, status, at.Wait.Round(time.Millisecond), at.Reason.String())
	}
	return tw.Flush()
}
