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

// TestOutputSchemas: the output schemas the tools announce (schemas/*.json,
// embedded) are the ones mcp-go reflects from the results' Go types;
// -update rewrites them after a type changed.
func TestOutputSchemas(t *testing.T) {
	for _, tt := range []struct {
		file     string
		embedded []byte
		opt      mcp.ToolOption
	}{
		{"fetch.json", fetchSchema, mcp.WithOutputSchema[fetchResult]()},
		{"status.json", statusSchema, mcp.WithOutputSchema[report.Status]()},
	} {
		want, err := json.Marshal(mcp.NewTool("", tt.opt).OutputSchema)
		if err != nil {
			t.Fatal(err)
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
			t.Errorf("%s is not the schema reflected from its Go type: run go test ./tools -run TestOutputSchemas -update\ngot  %s\nwant %s", path, tt.embedded, want)
		}
	}
}
