package bench_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/bench"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func behaviour(t *testing.T, name string) bench.Behaviour {
	t.Helper()
	b, err := bench.BehaviourNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func cell(b bench.Behaviour, c bench.Client, accepted, refused int) bench.Cell {
	return bench.Cell{Behaviour: b, Client: c, Callers: 1, Windows: 6, Window: 4 * time.Second,
		Allowed: 240, Accepted: accepted, Sustained: float64(accepted) / 240, Refused: refused, LongestWait: 4200 * time.Millisecond}
}

func sustained(c bench.Cell, s float64) bench.Cell {
	c.Sustained = s
	return c
}

func TestJudge(t *testing.T) {
	seed, hidden := behaviour(t, "seed"), behaviour(t, "hidden")
	tests := []struct {
		name string
		row  []bench.Cell
		want bench.Verdict
	}{{
		name: "met",
		row:  []bench.Cell{cell(seed, bench.Naive, 240, 5000), cell(seed, bench.MCPQuota, 235, 0)},
		want: bench.Verdict{Met: true},
	}, {
		name: "one refusal where the limit is visible",
		row:  []bench.Cell{cell(seed, bench.MCPQuota, 235, 1)},
		want: bench.Verdict{Reasons: []string{"1 refusal (target 0)"}},
	}, {
		name: "one refusal is a hidden limit's discovery",
		row:  []bench.Cell{cell(hidden, bench.MCPQuota, 235, 1)},
		want: bench.Verdict{Met: true},
	}, {
		name: "too little used",
		row:  []bench.Cell{cell(seed, bench.MCPQuota, 200, 0)},
		want: bench.Verdict{Reasons: []string{"83% used (target 95%)"}},
	}, {
		name: "another client does as well with fewer refusals",
		row:  []bench.Cell{cell(seed, bench.Rate, 236, 0), cell(seed, bench.MCPQuota, 238, 1)},
		want: bench.Verdict{Reasons: []string{"1 refusal (target 0)", "x/time/rate does better"}},
	}, {
		name: "another client uses clearly more with no more refusals",
		row:  []bench.Cell{cell(seed, bench.Rate, 239, 0), cell(seed, bench.MCPQuota, 230, 0)},
		want: bench.Verdict{Reasons: []string{"x/time/rate does better"}},
	}, {
		name: "a point of share is noise",
		row:  []bench.Cell{cell(seed, bench.Rate, 240, 0), cell(seed, bench.MCPQuota, 238, 0)},
		want: bench.Verdict{Met: true},
	}, {
		name: "the run's share is not enough when the pace was not sustained",
		row:  []bench.Cell{sustained(cell(seed, bench.MCPQuota, 238, 0), 0.9)},
		want: bench.Verdict{Reasons: []string{"90% used (target 95%)"}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := bench.Judge(tt.row)
			if !ok {
				t.Fatal("Judge found no mcp-quota cell")
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Judge (-want +got):\n%s", diff)
			}
		})
	}
	if _, ok := bench.Judge([]bench.Cell{cell(seed, bench.Naive, 240, 9)}); ok {
		t.Error("Judge of a row without mcp-quota: got ok, want none")
	}
}

func TestMarkdown(t *testing.T) {
	seed, hidden := behaviour(t, "seed"), behaviour(t, "hidden")
	two := func(c bench.Cell) bench.Cell { c.Callers = 2; return c }
	r := &bench.Report{Scale: bench.DefaultScale, Windows: 6, Cells: []bench.Cell{
		cell(seed, bench.Naive, 240, 31000), cell(seed, bench.Retryable, 180, 6), cell(seed, bench.Rate, 236, 3), cell(seed, bench.MCPQuota, 232, 0),
		two(cell(seed, bench.Naive, 240, 25000)), two(sustained(cell(seed, bench.MCPQuota, 239, 0), 0.9)),
		{Behaviour: hidden, Client: bench.MCPQuota, Callers: 1, Windows: 6, Window: 4 * time.Second, Allowed: 120, Accepted: 118, Sustained: 0.96, Refused: 1, LongestWait: 8 * time.Second},
	}}
	var b bytes.Buffer
	if err := r.Markdown(&b); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "table.golden.md")
	if *update {
		if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), b.String()); diff != "" {
		t.Errorf("Markdown (-want +got):\n%s", diff)
	}
}
