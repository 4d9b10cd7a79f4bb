package rest_test

import (
	"os"
	"testing"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// The longest tests here run the vendors' SDKs (go-github, octokit, the
// OpenAI Node client) for several windows of real time each, and wait
// more than they compute: they call t.Parallel, and four tests run at a
// time.
func TestMain(m *testing.M) { os.Exit(testkit.RunWaiting(m, 4)) }
