package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	bareOnce sync.Once
	barePath string
	bareErr  error
)

// bareStdio builds testdata/barestdio, a bare mcp-go stdio server, once
// per test run and returns its path.
func bareStdio(t testing.TB) string {
	t.Helper()
	bareOnce.Do(func() {
		dir, err := os.MkdirTemp("", "mcp-quota-bare")
		if err != nil {
			bareErr = err
			return
		}
		barePath = filepath.Join(dir, "barestdio")
		out, err := exec.Command("go", "build", "-o", barePath, "./testdata/barestdio").CombinedOutput()
		if err != nil {
			bareErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if bareErr != nil {
		t.Fatal(bareErr)
	}
	return barePath
}

// initialize is the first message an MCP client sends.
const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}` + "\n"

// startOnce spawns cmd, sends initialize, and returns the time from the
// spawn to the answer's first line, the CPU time the process had taken
// when that line came (0 where it cannot be read), and, once the process
// ended (stdin closed), the CPU time it took in all.
func startOnce(b *testing.B, cmd *exec.Cmd) (took, toAnswer, cpu time.Duration) {
	b.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	io.WriteString(stdin, initialize)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	took = time.Since(start)
	toAnswer = cpuSoFar(cmd.Process.Pid)
	if err != nil || !strings.Contains(line, `"protocolVersion"`) {
		cmd.Process.Kill()
		cmd.Wait()
		b.Fatalf("%s: no initialize answer (%v): %q\n%s", cmd.Path, err, line, stderr.String())
	}
	stdin.Close()
	io.Copy(io.Discard, stdout)
	cmd.Wait()
	return took, toAnswer, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

// cpuSoFar returns the CPU time the running process pid has taken so
// far, summed over its threads from Linux's schedstat (nanoseconds on a
// CPU); 0 where that cannot be read. Unlike the wall time to an answer,
// it does not grow with the load of a shared machine.
func cpuSoFar(pid int) time.Duration {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum time.Duration
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			ns, _ := strconv.ParseInt(f[0], 10, 64)
			sum += time.Duration(ns)
		}
	}
	return sum
}

// BenchmarkStdioStart measures `mcp-quota stdio` from spawn to its
// answer to initialize, beside a bare mcp-go stdio server with one tool
// (testdata/barestdio), in turns within one run: first starts, each on a
// state file that does not exist yet, and later starts, on a state file
// an earlier start made. Reported per target: p50 in ms, the mean CPU
// time the process had taken when its answer came, and the mean CPU time
// of a whole run (start, initialize, stop), in ms; the log lines give the
// ratios. On a machine whose cores are shared, the wall time moves with
// the load, the CPU time much less.
//
//	go test ./cmd/mcp-quota -run '^$' -bench BenchmarkStdioStart -benchtime 40x -v
func BenchmarkStdioStart(b *testing.B) {
	bare, mq := bareStdio(b), binary(b)
	s := newSetup(b, demoKey("http://127.0.0.1:9/", 120, time.Minute))
	dir := b.TempDir()
	later := filepath.Join(dir, "later.db")
	command := func(bin, state string) *exec.Cmd {
		cmd := exec.Command(bin, "stdio", "--config", s.config, "--state", state)
		cmd.Env = append(os.Environ(), s.env...)
		return cmd
	}
	startOnce(b, command(mq, later)) // makes the file the later starts open
	targets := []struct {
		name string
		cmd  func(i int) *exec.Cmd
	}{
		{"bare", func(int) *exec.Cmd { return exec.Command(bare) }},
		{"first", func(i int) *exec.Cmd { return command(mq, filepath.Join(dir, fmt.Sprintf("first-%d.db", i))) }},
		{"later", func(int) *exec.Cmd { return command(mq, later) }},
	}
	// MCP_QUOTA_BENCH_BASE names another mcp-quota binary (an earlier
	// build) measured in the same turns, on state files of its own.
	if base := os.Getenv("MCP_QUOTA_BENCH_BASE"); base != "" {
		baseLater := filepath.Join(dir, "base-later.db")
		startOnce(b, command(base, baseLater))
		targets = append(targets,
			struct {
				name string
				cmd  func(i int) *exec.Cmd
			}{"base-first", func(i int) *exec.Cmd { return command(base, filepath.Join(dir, fmt.Sprintf("base-first-%d.db", i))) }},
			struct {
				name string
				cmd  func(i int) *exec.Cmd
			}{"base-later", func(int) *exec.Cmd { return command(base, baseLater) }})
	}
	took := map[string][]time.Duration{}
	cpu, toAnswer := map[string]time.Duration{}, map[string]time.Duration{}
	b.ResetTimer()
	for i := range b.N {
		for _, tt := range targets {
			d, a, c := startOnce(b, tt.cmd(i))
			took[tt.name] = append(took[tt.name], d)
			cpu[tt.name] += c
			toAnswer[tt.name] += a
		}
	}
	b.StopTimer()
	p50 := map[string]time.Duration{}
	for _, tt := range targets {
		ds := took[tt.name]
		slices.Sort(ds)
		p50[tt.name] = ds[len(ds)/2]
		b.ReportMetric(float64(p50[tt.name].Microseconds())/1000, "p50-ms-"+tt.name)
		b.ReportMetric(float64(cpu[tt.name].Microseconds())/1000/float64(b.N), "cpu-ms-"+tt.name)
		b.ReportMetric(float64(toAnswer[tt.name].Microseconds())/1000/float64(b.N), "answer-cpu-ms-"+tt.name)
	}
	for _, name := range []string{"first", "later", "base-first", "base-later"} {
		if p, ok := p50[name]; ok {
			b.Logf("stdio start, p50: %s %v, %.1f× the bare server's %v; CPU until the answer %.1f×, CPU a run %.1f×", name, p.Round(100*time.Microsecond),
				float64(p)/float64(p50["bare"]), p50["bare"].Round(100*time.Microsecond),
				float64(toAnswer[name])/float64(toAnswer["bare"]), float64(cpu[name])/float64(cpu["bare"]))
		}
	}
}
