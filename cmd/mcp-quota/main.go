// Command mcp-quota is an MCP server (stdio and Streamable HTTP) and a REST
// gateway that gives agents and sync jobs quota-aware access to HTTP APIs:
// one budget per key, shared by every caller and process, paced so the
// upstream never has to say 429.
//
//	mcp-quota serve --demo          # demo upstream + MCP + REST on loopback
//	mcp-quota serve                 # MCP at /mcp and REST at /k/{key}/ on 127.0.0.1:8787
//	mcp-quota stdio                 # MCP over stdio, for an assistant's config
//	mcp-quota status [--json]       # what is left, per key and policy
//	mcp-quota activity [--key K]    # recent attempts and refusals
//	mcp-quota demo-upstream         # the demo upstream alone
package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/mcp-quota/mcp-quota/internal/spelling"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// A second SIGTERM or Ctrl-C does not wait for the drain: it ends
		// the process at once.
		<-ctx.Done()
		stop()
	}()
	if err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv); err != nil {
		if !errors.Is(err, errUsage) {
			fmt.Fprintln(os.Stderr, "mcp-quota:", err)
		}
		os.Exit(1)
	}
}

// commands are the subcommands dispatch knows.
var commands = []string{"serve", "stdio", "status", "activity", "demo-upstream", "bench", "init", "version", "help"}

// errUsage means the usage was printed to stderr (exit status 1); errHelp
// that help was asked for and printed to stdout (exit status 0).
var (
	errUsage = errors.New("usage")
	errHelp  = errors.New("help")
)

const usage = `mcp-quota: quota-aware access to HTTP APIs for agents (MCP) and sync jobs (REST)

Usage:
  mcp-quota serve [--demo] [--listen 127.0.0.1:8787] [--config F] [--state F]
  mcp-quota stdio [--caller NAME] [--config F] [--state F]
  mcp-quota status [--json] [--key K] [--config F] [--state F]
  mcp-quota activity [--key K] [--limit N] [--json] [--config F] [--state F]
  mcp-quota demo-upstream [--listen 127.0.0.1:8788] [--mode seed] [--quota 120] [--window 1m] [--token T]
  mcp-quota bench quota [-quick] [-windows N] [-window 4s] [-behaviours a,b] [-clients a,b] [-callers 1,2]
  mcp-quota init [--config F]
  mcp-quota version
  mcp-quota help [COMMAND]

Configuration: --config or MCP_QUOTA_CONFIG (default: the user config dir, mcp-quota/config.toml).
State: --state or MCP_QUOTA_STATE (default: the user state dir, mcp-quota/state.db).
Logs: stderr, --log-level debug|info|warn|error.
Run "mcp-quota help <command>" or "mcp-quota <command> -h" for a command's flags.
`

// run is the whole program: args without the program name, the three
// standard streams and the environment.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) error {
	err := dispatch(ctx, args, stdin, stdout, stderr, getenv)
	if errors.Is(err, errHelp) {
		return nil
	}
	return err
}

// dispatch runs the command args names (serve, stdio, status, activity,
// …) with the rest of args as its flags; without one it prints the usage.
func dispatch(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	env := environment{getenv: getenv, stdout: stdout, stderr: stderr}
	switch args[0] {
	case "serve":
		return env.serve(ctx, args[1:])
	case "stdio":
		return env.stdio(ctx, args[1:], stdin)
	case "status":
		return env.status(ctx, args[1:])
	case "activity":
		return env.activity(ctx, args[1:])
	case "demo-upstream":
		return env.demoUpstream(ctx, args[1:])
	case "bench":
		return env.bench(ctx, args[1:])
	case "init":
		return env.init(args[1:])
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, versionLine())
		return nil
	case "help", "-h", "-help", "--help":
		if len(args) > 1 && args[1] != "help" && !strings.HasPrefix(args[1], "-") {
			return dispatch(ctx, []string{args[1], "-h"}, stdin, stdout, stderr, getenv)
		}
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "mcp-quota: unknown command %q", args[0])
	if best := spelling.Closest(args[0], commands); best != "" {
		fmt.Fprintf(stderr, ": did you mean %s?", best)
	}
	fmt.Fprintf(stderr, "\n\n%s", usage)
	return errUsage
}
