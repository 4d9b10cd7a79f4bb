package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/mcp-quota/mcp-quota/bench"
)

const benchUsage = `Usage:
  mcp-quota bench quota [-quick] [-windows N] [-window 4s] [-quota N] [-behaviours a,b] [-clients a,b] [-callers 1,2] [-v]

Runs the pacing benchmark against the demo upstream in real time and prints
a Markdown table (see BENCHMARKS.md). Progress goes to stderr.
`

// bench runs a benchmark: "bench quota", or "bench worker", the hidden
// worker process a two-caller run re-executes this binary as.
func (e environment) bench(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, benchUsage)
		return errUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(e.stdout, benchUsage)
		return errHelp
	case "quota":
		return e.benchQuota(ctx, args[1:])
	case "worker":
		return bench.Worker(ctx, os.Stdin, e.stdout, e.stderr)
	}
	fmt.Fprintf(e.stderr, "mcp-quota bench: unknown benchmark %q\n\n%s", args[0], benchUsage)
	return errUsage
}

func (e environment) benchQuota(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("mcp-quota bench quota", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	quick := fs.Bool("quick", false, "a smoke test (about 25 s): seed and sliding, naive and mcp-quota, runs of 2 windows of 2 s")
	windows := fs.Int("windows", 0, "windows per run (default 6; 2 with -quick)")
	window := fs.Duration("window", 0, "the window, whole seconds (default 4s; 2s with -quick); the quotas scale with it")
	quota := fs.Int("quota", 0, "calls per window (default: 10 per second of window)")
	behaviours := fs.String("behaviours", "", "comma-separated behaviours (default all): seed, sliding, hidden, github, retry-after, silent, liar, servers")
	clients := fs.String("clients", "", "comma-separated clients (default all): naive, retryablehttp, rate, mcp-quota")
	callers := fs.String("callers", "", "comma-separated numbers of callers sharing the key: 1, 2 (default both)")
	verbose := fs.Bool("v", false, "also log mcp-quota's warnings (hidden limits, open circuits) and every run's pauses to stderr")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	o, err := benchOptions(*quick, *windows, *window, *quota, *behaviours, *clients, *callers)
	if err != nil {
		return err
	}
	o.Progress, o.Verbose = e.stderr, *verbose
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	o.Worker = func(ctx context.Context) *exec.Cmd { return exec.CommandContext(ctx, exe, "bench", "worker") }
	fmt.Fprintf(e.stderr, "mcp-quota bench quota: about %s per run\n", o.Duration())
	rep, err := bench.Run(ctx, o)
	if err != nil {
		return err
	}
	if err := rep.Markdown(e.stdout); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "\nWall time: %s.\n", rep.Elapsed.Round(time.Second))
	return nil
}

// benchOptions turns the flags into bench.Options.
func benchOptions(quick bool, windows int, window time.Duration, quota int, behaviours, clients, callers string) (bench.Options, error) {
	o := bench.Options{}
	if quick {
		o = bench.QuickOptions()
	}
	if windows > 0 {
		o.Windows = windows
	}
	if window > 0 || quota > 0 {
		base := o.Scale
		if base == (bench.Scale{}) {
			base = bench.DefaultScale
		}
		o.Scale = base.With(window, quota)
	}
	if behaviours != "" {
		o.Behaviours = nil
		for _, name := range splitList(behaviours) {
			b, err := bench.BehaviourNamed(name)
			if err != nil {
				return o, err
			}
			o.Behaviours = append(o.Behaviours, b)
		}
	}
	if clients != "" {
		o.Clients = nil
		for _, name := range splitList(clients) {
			c, err := bench.ParseClient(name)
			if err != nil {
				return o, err
			}
			o.Clients = append(o.Clients, c)
		}
	}
	if callers != "" {
		o.Callers = nil
		for _, s := range splitList(callers) {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > 2 {
				return o, fmt.Errorf("-callers %q: use 1, 2 or 1,2", callers)
			}
			o.Callers = append(o.Callers, n)
		}
	}
	return o, nil
}
