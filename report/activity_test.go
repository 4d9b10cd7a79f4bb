package report

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// The activity carries an attempt's reason as a sentence for a reader
// and its kind for a program: a late attempt is found by "late", not by
// its words; an attempt without a reason carries neither.
func TestActivityCarriesTheReasonsKind(t *testing.T) {
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name string
		r    reason.Reason
		want map[string]any
	}{
		{"late", reason.Reason{Kind: reason.Late, For: 700 * time.Millisecond, Allowed: 250 * time.Millisecond},
			map[string]any{"reason_kind": "late"}},
		{"answered", reason.Reason{Kind: reason.Answered, Status: 200}, map[string]any{"reason_kind": "answered"}},
		{"none", reason.Reason{}, map[string]any{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := NewActivity(ledger.Attempt{ID: 7, CallID: "c", Attempt: 1, Key: "demo", State: ledger.Failed, At: at, Reason: tt.r})
			b, err := json.Marshal(a)
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if tt.r.Kind != "" && got["reason"] != tt.r.String() {
				t.Errorf("reason %q, want %q", got["reason"], tt.r.String())
			}
			kinds := map[string]any{}
			if k, ok := got["reason_kind"]; ok {
				kinds["reason_kind"] = k
			}
			if diff := cmp.Diff(kinds, tt.want); diff != "" {
				t.Errorf("%s (-got +want):\n%s", b, diff)
			}
		})
	}
}
