package state

import (
	"encoding/base64"
	"encoding/json"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// appendJournalLine appends f's journal line to b: the bytes
// json.Marshal(journalLineOf(f)) gives, written field by field instead of
// by reflection, since every call that ends through the journal encodes
// one before its caller hears its answer. What it cannot write as
// encoding/json would (an attempt without an ID, a time encoding/json
// refuses, a share or rate that is not a finite number) goes through
// encoding/json, errors and all. TestJournalLineEncoding and
// FuzzJournalLine hold the two to the same bytes; Recover reads the lines
// with encoding/json.
func appendJournalLine(b []byte, f ledger.Finished) ([]byte, error) {
	if f.Attempt.ID != 0 { // an attempt without one is omitted (omitzero) or read as nothing
		e := lineEncoder{b: b, ok: true}
		e.line(f)
		if e.ok {
			return e.b, nil
		}
	}
	line, err := json.Marshal(journalLineOf(f))
	return append(b, line...), err
}

// appendKeptLine appends k's journal line to b: the bytes
// json.Marshal(journalLine{Kept: k}) gives, written field by field, as
// appendJournalLine writes an outcome's, since every fetch whose answer
// is kept encodes one before its caller hears the answer. A time
// encoding/json refuses goes through encoding/json, errors and all.
// TestKeptLineEncoding and FuzzKeptLine hold the two to the same bytes.
func appendKeptLine(b []byte, k *keptAnswer) ([]byte, error) {
	e := lineEncoder{b: b, ok: true}
	e.kept(k)
	if e.ok {
		return e.b, nil
	}
	line, err := json.Marshal(journalLine{Kept: k})
	return append(b, line...), err
}

// kept writes k's line.
func (e *lineEncoder) kept(k *keptAnswer) {
	r := k.Response
	e.b = append(e.b, `{"kept":{"response":{"Key":`...)
	str(e, r.Key)
	e.b = append(e.b, `,"Target":`...)
	str(e, r.Target)
	e.b = append(e.b, `,"ETag":`...)
	str(e, r.ETag)
	e.b = append(e.b, `,"LastModified":`...)
	str(e, r.LastModified)
	e.b = append(e.b, `,"Status":`...)
	e.b = strconv.AppendInt(e.b, int64(r.Status), 10)
	e.b = append(e.b, `,"ContentType":`...)
	str(e, r.ContentType)
	e.b = append(e.b, `,"Body":`...)
	if r.Body == nil {
		e.b = append(e.b, "null"...)
	} else {
		e.b = append(e.b, '"')
		e.b = base64.StdEncoding.AppendEncode(e.b, r.Body)
		e.b = append(e.b, '"')
	}
	e.b = append(e.b, `,"Digest":`...)
	str(e, r.Digest)
	e.b = append(e.b, `,"StoredAt":`...)
	e.time(r.StoredAt)
	e.b = append(e.b, `,"Unchanged":`...)
	e.b = strconv.AppendInt(e.b, int64(r.Unchanged), 10)
	e.b = append(e.b, `,"Vary":`...)
	str(e, r.Vary)
	e.b = append(e.b, `,"Varied":`...)
	str(e, r.Varied)
	e.b = append(e.b, `},"keep":`...)
	e.b = strconv.AppendInt(e.b, int64(k.Keep), 10)
	e.b = append(e.b, "}}"...)
}

// appendReason appends r as json.Marshal(r) gives it, and reports
// whether it could (not when a share or rate is not a finite number, or
// a time is one encoding/json refuses).
func appendReason(b []byte, r reason.Reason) ([]byte, bool) {
	e := lineEncoder{b: b, ok: true}
	e.reason(r)
	return e.b, e.ok
}

// A lineEncoder appends JSON to b; ok turns false at the first value it
// cannot write as encoding/json would.
type lineEncoder struct {
	b  []byte
	ok bool
}

// line writes f as journalLineOf(f) is marshalled.
func (e *lineEncoder) line(f ledger.Finished) {
	a := f.Attempt
	e.b = append(e.b, `{"attempt":{`...)
	e.attempt(a)
	e.b = append(e.b, `,"Reason":`...)
	str(e, olderWords(a.Reason))
	if !a.Reason.IsZero() {
		e.b = append(e.b, `,"Why":`...)
		e.reason(a.Reason)
	}
	e.b = append(e.b, `,"LeaseUntil":`...)
	e.time(a.InFlightUntil)
	e.b = append(e.b, `,"ByCaller":`...)
	e.b = strconv.AppendBool(e.b, a.CallerReserves)
	e.b = append(e.b, '}')
	if len(f.Observations) > 0 {
		e.b = append(e.b, `,"observations":[`...)
		for i, o := range f.Observations {
			if i > 0 {
				e.b = append(e.b, ',')
			}
			e.observation(o)
		}
		e.b = append(e.b, ']')
	}
	e.b = append(e.b, '}')
}

// attempt writes a's fields but its Reason, InFlightUntil and CallerReserves, which the
// journal line writes its own way, in ledger.Attempt's order. A field
// added to ledger.Attempt goes here too (TestJournalLineEncoding fails
// until it does).
func (e *lineEncoder) attempt(a ledger.Attempt) {
	e.b = append(e.b, `"ID":`...)
	e.b = strconv.AppendInt(e.b, a.ID, 10)
	e.b = append(e.b, `,"CallID":`...)
	str(e, a.CallID)
	e.b = append(e.b, `,"Attempt":`...)
	e.b = strconv.AppendInt(e.b, int64(a.Attempt), 10)
	e.b = append(e.b, `,"Key":`...)
	str(e, a.Key)
	e.b = append(e.b, `,"Caller":`...)
	str(e, a.Caller)
	e.b = append(e.b, `,"Transport":`...)
	str(e, string(a.Transport))
	e.b = append(e.b, `,"Method":`...)
	str(e, a.Method)
	e.b = append(e.b, `,"Target":`...)
	str(e, a.Target)
	e.b = append(e.b, `,"Digest":`...)
	str(e, a.Digest)
	e.b = append(e.b, `,"Bytes":`...)
	e.b = strconv.AppendInt(e.b, a.Bytes, 10)
	e.b = append(e.b, `,"State":`...)
	str(e, a.State)
	e.b = append(e.b, `,"Probe":`...)
	e.b = strconv.AppendBool(e.b, a.Probe)
	e.b = append(e.b, `,"At":`...)
	e.time(a.At)
	e.b = append(e.b, `,"Wait":`...)
	e.b = strconv.AppendInt(e.b, int64(a.Wait), 10)
	e.b = append(e.b, `,"SentAt":`...)
	e.time(a.SentAt)
	e.b = append(e.b, `,"AnsweredAt":`...)
	e.time(a.AnsweredAt)
	e.b = append(e.b, `,"Status":`...)
	e.b = strconv.AppendInt(e.b, int64(a.Status), 10)
	e.b = append(e.b, `,"Instance":`...)
	str(e, a.Instance)
	e.b = append(e.b, `,"Principal":`...)
	str(e, a.Principal)
}

// observation writes o as encoding/json does (ledger.ObservationRecord
// has no tags; its ratelimit.Observation is embedded).
func (e *lineEncoder) observation(o ledger.ObservationRecord) {
	e.b = append(e.b, `{"ID":`...)
	e.b = strconv.AppendInt(e.b, o.ID, 10)
	e.b = append(e.b, `,"Key":`...)
	str(e, o.Key)
	e.b = append(e.b, `,"AttemptID":`...)
	e.b = strconv.AppendInt(e.b, o.AttemptID, 10)
	e.b = append(e.b, `,"Policy":`...)
	str(e, o.Policy)
	e.b = append(e.b, `,"Unit":`...)
	str(e, o.Unit)
	e.b = append(e.b, `,"Partition":`...)
	str(e, o.Partition)
	e.b = append(e.b, `,"Quota":`...)
	e.b = strconv.AppendInt(e.b, o.Quota, 10)
	e.b = append(e.b, `,"HasQuota":`...)
	e.b = strconv.AppendBool(e.b, o.HasQuota)
	e.b = append(e.b, `,"Window":`...)
	e.b = strconv.AppendInt(e.b, int64(o.Window), 10)
	e.b = append(e.b, `,"Remaining":`...)
	e.b = strconv.AppendInt(e.b, o.Remaining, 10)
	e.b = append(e.b, `,"HasRemaining":`...)
	e.b = strconv.AppendBool(e.b, o.HasRemaining)
	e.b = append(e.b, `,"Reset":`...)
	e.b = strconv.AppendInt(e.b, int64(o.Reset), 10)
	e.b = append(e.b, `,"HasReset":`...)
	e.b = strconv.AppendBool(e.b, o.HasReset)
	e.b = append(e.b, `,"Shape":`...)
	str(e, o.Shape)
	e.b = append(e.b, `,"Profile":`...)
	str(e, o.Profile)
	e.b = append(e.b, `,"Guessed":`...)
	e.b = strconv.AppendBool(e.b, o.Guessed)
	e.b = append(e.b, `,"PerRoute":`...)
	e.b = strconv.AppendBool(e.b, o.PerRoute)
	e.b = append(e.b, `,"Status":`...)
	e.b = strconv.AppendInt(e.b, int64(o.Status), 10)
	e.b = append(e.b, `,"ReceivedAt":`...)
	e.time(o.ReceivedAt)
	e.b = append(e.b, `,"ServerDate":`...)
	e.time(o.ServerDate)
	e.b = append(e.b, `,"FromCache":`...)
	e.b = strconv.AppendBool(e.b, o.FromCache)
	e.b = append(e.b, `,"Method":`...)
	str(e, o.Method)
	e.b = append(e.b, `,"Target":`...)
	str(e, o.Target)
	e.b = append(e.b, '}')
}

// reason writes r as encoding/json does by its tags: kind always, every
// other field omitted when zero.
func (e *lineEncoder) reason(r reason.Reason) {
	e.b = append(e.b, `{"kind":`...)
	str(e, r.Kind)
	optStr(e, `,"policy":`, r.Policy)
	optStr(e, `,"unit":`, r.Unit)
	optStr(e, `,"principal":`, r.Principal)
	optStr(e, `,"other":`, r.Other)
	e.optFloat(`,"share":`, r.Share)
	optInt(e, `,"limit":`, r.Limit)
	optInt(e, `,"used":`, r.Used)
	optInt(e, `,"left":`, r.Left)
	optInt(e, `,"held":`, r.Held)
	optInt(e, `,"carries":`, r.Carries)
	optInt(e, `,"inFlight":`, r.InFlight)
	optInt(e, `,"behind":`, r.Behind)
	optInt(e, `,"window":`, r.Window)
	optInt(e, `,"for":`, r.For)
	optInt(e, `,"spacing":`, r.Spacing)
	e.optFloat(`,"rate":`, r.Rate)
	optStr(e, `,"source":`, r.Source)
	optStr(e, `,"said":`, r.Said)
	optStr(e, `,"key":`, r.Key)
	optStr(e, `,"route":`, r.Route)
	optInt(e, `,"status":`, r.Status)
	optInt(e, `,"failures":`, r.Failures)
	if r.Short {
		e.b = append(e.b, `,"short":true`...)
	}
	optInt(e, `,"allowed":`, r.Allowed)
	optInt(e, `,"buckets":`, r.Buckets)
	if !r.Until.IsZero() {
		e.b = append(e.b, `,"until":`...)
		e.time(r.Until)
	}
	optStr(e, `,"violated":`, r.Violated)
	optStr(e, `,"because":`, r.Because)
	optInt(e, `,"retryAfter":`, r.RetryAfter)
	optStr(e, `,"error":`, r.Error)
	e.b = append(e.b, '}')
}

// optStr writes the string field name and s unless s is empty.
func optStr[S ~string](e *lineEncoder, name string, s S) {
	if s != "" {
		e.b = append(e.b, name...)
		str(e, s)
	}
}

// optInt writes the integer field name and n unless n is 0.
func optInt[I ~int | ~int64](e *lineEncoder, name string, n I) {
	if n != 0 {
		e.b = append(e.b, name...)
		e.b = strconv.AppendInt(e.b, int64(n), 10)
	}
}

// optFloat writes f as encoding/json writes a float64: the shortest
// decimal that reads back as f, in exponent form below 1e-6 and from
// 1e21 on, with a one-digit negative exponent left unpadded.
func (e *lineEncoder) optFloat(name string, f float64) {
	if f == 0 {
		return
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		e.ok = false // encoding/json refuses it
		return
	}
	e.b = append(e.b, name...)
	format := byte('f')
	if abs := math.Abs(f); abs < 1e-6 || abs >= 1e21 {
		format = 'e'
	}
	e.b = strconv.AppendFloat(e.b, f, format, -1, 64)
	if n := len(e.b); format == 'e' && n >= 4 && e.b[n-4] == 'e' && e.b[n-3] == '-' && e.b[n-2] == '0' {
		e.b[n-2] = e.b[n-1] // e-07 to e-7
		e.b = e.b[:n-1]
	}
}

// time writes t as time.Time's MarshalJSON does; a time it refuses (a
// year outside 0–9999, an offset of a day or more) leaves e not ok.
func (e *lineEncoder) time(t time.Time) {
	e.b = append(e.b, '"')
	b, err := t.AppendText(e.b)
	if err != nil {
		e.ok = false
		return
	}
	e.b = append(b, '"')
}

// str writes s as encoding/json writes a string: quoted, with '"', '\\'
// and control characters escaped, '<', '>' and '&' as \u003c, \u003e,
// \u0026, U+2028 and U+2029 escaped, and invalid UTF-8 as U+FFFD.
func str[S ~string](e *lineEncoder, s S) { e.b = appendJSONString(e.b, s) }

// appendJSONString appends s to b as str writes it.
func appendJSONString[S ~string](b []byte, s S) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(string(s[i:]))
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
