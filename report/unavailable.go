package report

import (
	"errors"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// Unavailable says in words why the state cannot be used, for a caller:
// its database does not answer (ledger.ErrUnavailable), or else its file
// failed.
func Unavailable(err error) string {
	if errors.Is(err, ledger.ErrUnavailable) {
		return "mcp-quota's state database does not answer"
	}
	return "mcp-quota's state file cannot be used (it is full, unwritable or damaged)"
}
