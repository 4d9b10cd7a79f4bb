package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

// starterConfig is what "mcp-quota init" writes, and examples/config.toml
// (a test keeps the two the same and loads it).
const starterConfig = `# mcp-quota configuration (written by "mcp-quota init"; README.md, "Configuration", has every field).
# Each [[keys]] entry is one API key with one budget, shared by every caller and process
# that uses this file and the same state file.

# retention = "168h"                 # how long the state keeps the activity (default 7 days;
                                     # at least an hour and the longest window below)

[[keys]]
name = "example"                     # the name agents and sync jobs use: fetch(key="example"), /k/example/…
base_url = "https://api.example.com" # calls may only go below this URL
secret_env = "EXAMPLE_API_KEY"       # the API key is read from this variable (or secret_file = "/path");
                                     # it is never written here, and never reaches the model
auth = "bearer"                      # how it is sent: bearer | header:X-Api-Key | query:api_key | none
profile = "ietf"                     # how to read X-RateLimit-* headers: ietf, github, openai, anthropic, …
# methods = ["GET", "HEAD"]          # what the MCP fetch tool may send (default GET, HEAD)
# max_rate = 10                      # calls per second at most (default 10)
# max_concurrency = 4                # calls in flight at once, across processes (default 4)

  # The documented limits, enforced locally over a sliding window. What the API
  # announces in its headers is read as well; these apply even before it says anything.
  [[keys.policies]]
  name = "default"
  quota = 120                        # calls…
  window = "60s"                     # …per this window

# Callers of the REST side (/k/{key}/…) and of MCP over HTTP, each with a token of at
# least 16 characters. Without any, a loopback listener lets every local request in
# (as the caller "local"); stdio needs none.
#
# [[callers]]
# name = "sync"
# token_env = "SYNC_TOKEN"           # or token_file = "/path"
# keys = ["example"]                 # or ["*"]
`

// init writes a commented starting configuration. It never overwrites a
// file that exists.
func (e environment) init(args []string) error {
	var c common
	fs := flag.NewFlagSet("mcp-quota init", flag.ContinueOnError)
	fs.StringVar(&c.config, "config", e.getenv("MCP_QUOTA_CONFIG"), "where to write the configuration (default: the user config dir, mcp-quota/config.toml)")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	path := e.configPath(c)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("cannot create the configuration's directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%s already exists: mcp-quota init never overwrites a configuration (edit it, or give another path with --config)", path)
	}
	if err != nil {
		return err
	}
	if _, err := f.WriteString(starterConfig); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "wrote %s\n  edit base_url, secret_env and the policy for your API, then check it with: mcp-quota status --config %s\n", path, path)
	return nil
}
