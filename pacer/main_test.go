package pacer_test

import (
	"os"
	"testing"

	"github.com/mcp-quota/mcp-quota/internal/conformance"
)

// The test binary serves as the helper processes of the benchmarks that
// run several processes on one state file (conformance.StartHelper).
func TestMain(m *testing.M) {
	conformance.RunHelper()
	os.Exit(m.Run())
}

// sqlite is the state as the helper processes open a SQLite file: the
// journals where state.Open keeps them.
var sqlite = conformance.Backend{Name: "SQLite", JournalDir: func(string) string { return "" }}
