package state

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// A journalLine is a line of a journal: an outcome, or an answer to keep
// (Kept, see KeepLater). An outcome is a ledger.Finished as JSON, its
// attempt's reason in it twice, as data (Why) and in words (Reason). The
// words are what a process of the previous version reads when it
// replays the journal of a process of this version that ended, as hosts
// are upgraded one at a time; a line that version wrote has the words
// only, and its reason reads back as them (reason.Said). A line whose
// Reason is the reason as data (ledger.Finished's own JSON form) reads
// back as that.
type journalLine struct {
	Attempt      journalAttempt             `json:"attempt,omitzero"`
	Observations []ledger.ObservationRecord `json:"observations,omitempty"`
	Kept         *keptAnswer                `json:"kept,omitempty"`
}

// A journalAttempt is an attempt as a journal line holds it: its Reason
// field hides the ledger.Attempt's own in the JSON, and its InFlightUntil
// is kept under the name the previous version reads, LeaseUntil, and its
// CallerReserves under ByCaller.
type journalAttempt struct {
	ledger.Attempt
	Reason         journalReason
	Why            *reason.Reason `json:",omitempty"`
	LeaseUntil     time.Time      // the attempt's InFlightUntil
	InFlightUntil  hiddenField    `json:",omitzero"` // LeaseUntil holds it
	ByCaller       bool           // the attempt's CallerReserves
	CallerReserves hiddenField    `json:",omitzero"` // ByCaller holds it
}

// A hiddenField hides in the JSON the field of its name of a struct
// embedded beside it: it writes nothing and reads anything.
type hiddenField struct{}

func (*hiddenField) UnmarshalJSON([]byte) error { return nil }

// A journalReason is the Reason of a journal line: written as words, read
// as words or as data.
type journalReason struct {
	words string
	data  *reason.Reason // when the line held the reason as data
}

func (r journalReason) MarshalJSON() ([]byte, error) { return json.Marshal(r.words) }

func (r *journalReason) UnmarshalJSON(b []byte) error {
	if bytes.HasPrefix(bytes.TrimSpace(b), []byte("{")) {
		r.data = new(reason.Reason)
		return json.Unmarshal(b, r.data)
	}
	return json.Unmarshal(b, &r.words)
}

// journalLineOf is f as a journal line holds it.
func journalLineOf(f ledger.Finished) journalLine {
	a := journalAttempt{Attempt: f.Attempt, Reason: journalReason{words: olderWords(f.Attempt.Reason)}, LeaseUntil: f.Attempt.InFlightUntil, ByCaller: f.Attempt.CallerReserves}
	if !f.Attempt.Reason.IsZero() {
		a.Why = &f.Attempt.Reason
	}
	return journalLine{Attempt: a, Observations: f.Observations}
}

// finished is what l holds.
func (l journalLine) finished() ledger.Finished {
	a := l.Attempt.Attempt
	a.InFlightUntil = l.Attempt.LeaseUntil
	a.CallerReserves = l.Attempt.ByCaller
	switch r := l.Attempt.Reason; {
	case l.Attempt.Why != nil:
		a.Reason = *l.Attempt.Why
	case r.data != nil:
		a.Reason = *r.data
	case r.words != "":
		a.Reason = reason.Reason{Kind: reason.Said, Said: r.words}
	}
	return ledger.Finished{Attempt: a, Observations: l.Observations}
}
