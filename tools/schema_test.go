package tools

import (
	"bytes"
	"encoding/json"
	goflag "flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcp-quota/mcp-quota/report"
)

var update = goflag.Bool("update", false, "rewrite the output schemas in schemas/ from the Go types")

// TestSchemas: the input and output schemas the tools announce
// (schemas/*.json, embedded) are the ones mcp-go reflects from the
// arguments' and results' Go types; -update rewrites them after a type
// changed.
func TestSchemas(t *testing.T) {
	output := func(opt mcp.ToolOption) func() ([]byte, error) {
		return func() ([]byte, error) { return json.Marshal(mcp.NewTool("", opt).OutputSchema) }
	}
	input := func(opt mcp.ToolOption) func() ([]byte, error) {
		return func() ([]byte, error) { return mcp.NewTool("", opt).RawInputSchema, nil }
	}
	for _, tt := range []struct {
		file      string
		embedded  []byte
		reflected func() ([]byte, error)
	}{
		{"fetch.json", fetchSchema, output(mcp.WithOutputSchema[fetchResult]())},
		{"status.json", statusSchema, output(mcp.WithOutputSchema[report.Status]())},
		{"fetch-input.json", fetchInput, input(mcp.WithInputSchema[fetchArgs]())},
		{"status-input.json", statusInput, input(mcp.WithInputSchema[statusArgs]())},
	} {
		want, err := tt.reflected()
		if err != nil || len(want) == 0 {
			t.Fatalf("%s: reflecting the type: %q, %v", tt.file, want, err)
		}
		want = append(want, '\n')
		path := filepath.Join("schemas", tt.file)
		if *update {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if !bytes.Equal(tt.embedded, want) {
			t.Errorf("%s is not the schema reflected from its Go type: run go test ./tools -run TestSchemas -update\ngot  %s\nwant %s", path, tt.embedded, want)
		}
	}
}
