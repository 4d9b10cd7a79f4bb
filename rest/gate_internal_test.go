package rest

import (
	"testing"

	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// A pause is a wait without spent quota only when a gate holds it: a
// spent policy named like a gate's source is still a spent budget.
func TestWaitOnlyByGateNotByName(t *testing.T) {
	spent := &pacer.Budget{Policy: "circuit", Limit: 10, Remaining: 0}
	for _, tt := range []struct {
		name string
		pe   pacer.PauseError
		want bool
	}{
		{"the policy circuit spent", pacer.PauseError{Source: "circuit", Binding: spent}, false},
		{"the policy circuit paced, budget left", pacer.PauseError{Source: "circuit", Binding: &pacer.Budget{Policy: "circuit", Limit: 10, Remaining: 3}}, false},
		{"the policy backoff, unseen", pacer.PauseError{Source: "backoff"}, false},
		{"the policy retry-after spent", pacer.PauseError{Source: "retry-after", Binding: &pacer.Budget{Policy: "retry-after", Limit: 5}}, false},
		{"the circuit breaker open", pacer.PauseError{Source: "circuit", Gate: ledger.CircuitGate}, true},
		{"a Retry-After with budget left", pacer.PauseError{Source: "retry-after", Gate: ledger.RetryAfterGate,
			Binding: &pacer.Budget{Policy: "default", Limit: 10, Remaining: 4}}, true},
		{"a Retry-After on a spent budget", pacer.PauseError{Source: "retry-after", Gate: ledger.RetryAfterGate, Binding: spent}, false},
	} {
		if got := waitOnly(&tt.pe); got != tt.want {
			t.Errorf("%s: waitOnly = %v, want %v", tt.name, got, tt.want)
		}
	}
}
