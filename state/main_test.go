package state_test

import (
	"os"
	"testing"

	"github.com/mcp-quota/mcp-quota/internal/conformance"
)

// TestMain lets the test binary serve as the conformance suite's helper
// processes.
func TestMain(m *testing.M) {
	conformance.RunHelper()
	os.Exit(m.Run())
}
