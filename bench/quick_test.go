package bench_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/mcp-quota/mcp-quota/bench"
)

// workerEnv marks a run of this test binary as a benchmark worker.
const workerEnv = "MCP_QUOTA_BENCH_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		if err := bench.Worker(context.Background(), os.Stdin, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestQuick is the benchmark's smoke test: "mcp-quota bench quota
// -quick" on the reference API's behaviour alone (its three runs, in real
// time, about 13 s; the command adds two runs on a sliding window). Its
// one promise is mcp-quota's: against the reference API's upstream, with
// one caller and with two in two processes, the upstream never refuses a
// call.
func TestQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("the benchmark runs in real time")
	}
	o := bench.QuickOptions()
	seed, err := bench.BehaviourNamed("seed")
	if err != nil {
		t.Fatal(err)
	}
	o.Behaviours = []bench.Behaviour{seed}
	o.Worker = func(ctx context.Context) *exec.Cmd {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), workerEnv+"=1")
		return cmd
	}
	var progress bytes.Buffer
	o.Progress = &progress
	rep, err := bench.Run(context.Background(), o)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	rep.Markdown(&table)
	t.Logf("wall time %s\n%s", rep.Elapsed, table.String())

	if got, want := len(rep.Cells), 3; got != want { // naive and mcp-quota with one caller, mcp-quota with two
		t.Fatalf("got %d cells, want %d", got, want)
	}
	for _, c := range rep.Cells {
		if c.Accepted == 0 || c.Allowed == 0 {
			t.Errorf("%s, %s, %d callers: %d accepted of %d allowed; want both positive", c.Behaviour.Name, c.Client, c.Callers, c.Accepted, c.Allowed)
		}
		if c.Behaviour.Name == "seed" && c.Client == bench.MCPQuota && c.Refused != 0 {
			t.Errorf("seed, mcp-quota, %d callers: the upstream refused %d calls, want 0", c.Callers, c.Refused)
		}
	}
}
