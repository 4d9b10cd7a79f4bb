// Package ledger is what the pacer keeps of every key, and the interfaces
// of the storage that keeps it: the attempts (the activity and the
// sliding-window log), the policies seen with their latest observation,
// every observation with its provenance, gates, each key's pacing state,
// warnings, claims and stored answers.
//
// The pacer and the other consumers own these types and interfaces; the
// back ends in package state (SQLite on one host, PostgreSQL across
// hosts) implement them, and one conformance suite (internal/conformance)
// holds each to the same behaviour.
package ledger

import (
	"context"
	"errors"
	"time"

	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// ErrUnavailable reports a store that did not answer: a database down,
// unreachable, restarting, or slower than its bound. Nothing is counted
// apart from it meanwhile: calls fail rather than go unaccounted.
var ErrUnavailable = errors.New("the state database is unavailable")

// ErrNoAnswer is the ErrUnavailable of a store that did not answer within
// its bound (a database hung, or slower than the bound): the transaction
// waited the whole bound. A call that waited for such a transaction of its
// key fails with it, rather than wait the bound again in one of its own.
// It reads as ErrUnavailable.
var ErrNoAnswer error = noAnswer{}

type noAnswer struct{}

func (noAnswer) Error() string { return ErrUnavailable.Error() }
func (noAnswer) Unwrap() error { return ErrUnavailable }

// A Store keeps the ledger of every key for every process that shares it.
//
// It offers two kinds of transaction. Update hands its function a Tx: what
// an admission or an outcome reads (Reader) and writes, and no history.
// View hands its function a ReadTx: the same reads and the history people
// read (History), and nothing that writes.
type Store interface {
	Viewer
	// Update runs fn in a read-write transaction, and commits what it
	// wrote when fn returns nil. It holds keys, the keys fn decides for,
	// before fn runs: their transactions are serialised with every other
	// that holds them, in this process or any other sharing the store, so
	// a decision read in fn still holds when its admission is written.
	// Transactions holding different keys do not wait for each other (on
	// a back end that can tell them apart). An admission of a key not
	// held (Tx.InsertAttempt of an Admitted attempt, Tx.Reserve) fails.
	//
	// fn may run more than once: a back end retries the transaction after
	// a deadlock, a serialisation failure or a connection that dropped
	// (PostgreSQL does; SQLite does not), rolling back what each earlier
	// run wrote. fn must therefore keep every effect inside tx: it reads
	// and writes through tx and leaves its results in variables it sets
	// afresh on every run, and memory outside the transaction changes only
	// after Update returns nil, from what the last run left. The pacer's
	// tests run every Update twice to hold it to this.
	Update(ctx context.Context, fn func(Tx) error, keys ...string) error
	// FinishLater records how a reserved slot's call (see Tx.Reserve),
	// or an attempt admitted alone, ended without waiting for a
	// transaction of its own: once it returns, the outcome survives a
	// crash of the process, and until it is recorded the attempt stays
	// counted as sent, and in flight for every other process.
	FinishLater(ctx context.Context, f Finished) error
}

// A Viewer reads the ledger.
type Viewer interface {
	// View runs fn in a read-only transaction: a consistent snapshot that
	// includes what this process's Updates and FinishLaters wrote.
	View(ctx context.Context, fn func(ReadTx) error) error
}

// A ReadTx is one read-only transaction on a Store (Store.View): what a
// decision reads, and the history. It writes nothing. It is not safe for
// concurrent use and must not be kept after the function it was passed
// to returns.
type ReadTx interface {
	Reader
	History
}

// A Tx is one read-write transaction on a Store (Store.Update): what an
// admission or an outcome reads and writes. It does not read the history
// (see History), which no decision rests on. It is not safe for
// concurrent use and must not be kept after the function it was passed
// to returns. Times are kept to the microsecond: a time written reads
// back truncated to it.
type Tx interface {
	Reader

	// InsertAttempt records a and returns its ID. An attempt recorded as
	// Admitted counts against its key's budget from then on, whatever its
	// end.
	InsertAttempt(a Attempt) (int64, error)
	// FinishAttempt records how attempt id ended, and ends its time in flight.
	FinishAttempt(id int64, state State, why reason.Reason, status int, sentAt, answeredAt time.Time) error
	// Reserve records n slots of key admitted at at, each in flight until
	// inFlightUntil, and returns the first and last of their IDs
	// (consecutive). They must not precede the key's latest admission.
	Reserve(key string, n int, at, inFlightUntil time.Time) (first, last int64, err error)
	// FinishReserved records the call a reserved slot was handed to and
	// how it ended, and ends its time in flight.
	FinishReserved(a Attempt) error
	// Release gives back key's reserved slots first…last, none of which
	// was handed out.
	Release(key string, first, last int64) error

	// PutSeenPolicy records k, the latest fresh observation of its policy.
	PutSeenPolicy(k SeenPolicy) error
	// DeleteSeenPolicy forgets key's policy of unit in partition, if it is
	// kept.
	DeleteSeenPolicy(key, policy string, unit ratelimit.Unit, partition string) error
	// AddObservation records o.
	AddObservation(o ObservationRecord) error
	// PutGate closes g's scope until g.Until; a gate is never shortened.
	PutGate(g Gate) error
	// PutKeyState records s.
	PutKeyState(s KeyState) error
	// PutPathState records s.
	PutPathState(s PathState) error
	// ForgetPaths forgets the failures of key's routes whose latest is
	// before before, and the gates of its routes (a Scope other than "")
	// that reopened before it.
	ForgetPaths(key string, before time.Time) error
	// AddWarning records w.
	AddWarning(w Warning) error
	// Claim says caller of key waits for admission until until.
	Claim(key, caller string, until time.Time) error

	// PutResponse keeps r, and at most keep answers of its key.
	PutResponse(r StoredResponse, keep int) error

	// Wait records that principal has calls of key waiting in waiter (a
	// name each process's pacer draws for itself) until until, in place of
	// what waiter recorded before (until now ends the record), and forgets
	// every record of key that ran out before now (a process that ended
	// while its calls waited): a key holds at most one record per
	// principal and live waiter.
	Wait(key, principal, waiter string, now, until time.Time) error
}

// A Reader is what a decision reads: the sliding-window log, the signals,
// the stored answers and the principals' shares of one key, read in a
// transaction of either kind.
type Reader interface {
	// Clock returns the instant the transaction takes place at, given the
	// process's own clock: the database server's clock for a back end
	// that many hosts share, so that every host counts one window, and
	// local as it is otherwise. In an Update it is read once the
	// transaction holds its first key, and does not go back from one
	// transaction of a key to the next.
	Clock(local time.Time) time.Time

	// Count returns how many attempts of key were admitted after since.
	Count(key string, since time.Time) (int, error)
	// WindowOf returns how many attempts of key were admitted after
	// since, and the oldest of them, with the counts of callers only,
	// each at a cost that does not grow with the window (see
	// Attempt.CallerReserves).
	WindowOf(key string, since time.Time, callers []string) (Window, error)
	// Nth returns the admission time of the n-th (1-based) oldest
	// admission of key after since, or the zero time when there are fewer.
	Nth(key string, since time.Time, n int) (time.Time, error)
	// Bytes returns the bytes the attempts of key admitted after since
	// carried (their Attempt.Bytes, summed), at a cost that does not grow
	// with the count.
	Bytes(key string, since time.Time) (int64, error)
	// NthByte returns the admission time of the oldest admission of key
	// after since by which the admissions after since have carried at
	// least n bytes (n >= 1), or the zero time when they carried fewer.
	NthByte(key string, since time.Time, n int64) (time.Time, error)
	// Sends returns the latest limit admissions of key after since, oldest
	// first.
	Sends(key string, since time.Time, limit int) ([]Send, error)
	// Flight returns how many attempts of key are unfinished with a lease
	// that has not run out by now, and the earliest admission among them.
	Flight(key string, now time.Time) (Flight, error)
	// AttemptState returns where attempt id of key stands, or "" when key
	// has no such attempt.
	AttemptState(key string, id int64) (State, error)
	// Repeats counts caller's attempts of key with digest after since.
	Repeats(key, caller, digest string, since time.Time) (int, error)

	// SeenPolicies returns every policy ever seen for key.
	SeenPolicies(key string) ([]SeenPolicy, error)
	// Gates returns key's gates still closed at now, the latest to open
	// first.
	Gates(key string, now time.Time) ([]Gate, error)
	// KeyState returns key's pacing state; a key never used has the zero
	// state.
	KeyState(key string) (KeyState, error)
	// PathState returns the failures of key's calls on one route (scope);
	// a route that has none has the zero state.
	PathState(key, scope string) (PathState, error)
	// FailingPaths returns how many of key's routes have a failure after
	// since.
	FailingPaths(key string, since time.Time) (int, error)
	// Warned reports whether a warning of kind was raised for key after
	// since.
	Warned(key string, kind WarningKind, since time.Time) (bool, error)
	// Claimed returns the callers of key with a claim still open at now.
	Claimed(key string, now time.Time) (map[string]bool, error)

	// Response returns the stored answer for key and target, if any.
	Response(key, target string) (StoredResponse, bool, error)

	// PrincipalWindow returns, for each of principals with an admission
	// of key after since recorded with Attempt.Principal, how many and
	// the oldest, at a cost that grows with the principals asked about,
	// not with the calls the window holds. Admissions recorded without a
	// principal (slots of a lease, calls made before the key had shares)
	// are not counted.
	PrincipalWindow(key string, since time.Time, principals []string) (map[string]Use, error)
	// Waiting returns the principals with calls of key waiting at now, on
	// any host, once each, in no particular order.
	Waiting(key string, now time.Time) ([]string, error)
}

// History is the read model: what people read of the ledger, through
// the activity (REST, the MCP activity resource, the activity command),
// quota_status and the status command, the dashboard and the metrics. No
// admission or outcome is decided on it, so only a View reads it.
type History interface {
	// Activity returns attempts matching f, newest first.
	Activity(f ActivityFilter) ([]Attempt, error)
	// Call returns the attempts of one call of key, in order.
	Call(key, callID string) ([]Attempt, error)
	// ObservationsOf returns what the answer to one attempt said.
	ObservationsOf(key string, attemptID int64) ([]ObservationRecord, error)
	// Warnings returns key's warnings raised after since, newest first.
	Warnings(key string, since time.Time) ([]Warning, error)
	// Timeline counts key's attempts from since on, per step and state.
	Timeline(key string, since time.Time, step time.Duration) ([]Bucket, error)
	// Window returns how many attempts of key were admitted after since,
	// and the oldest of them, at a cost that does not grow with the count.
	Window(key string, since time.Time) (Window, error)
	// WindowByCaller is Window with the count of every caller.
	WindowByCaller(key string, since time.Time) (Window, error)
	// Latest returns the time of key's latest admission, or zero.
	Latest(key string) (time.Time, error)
}

// A State is where an attempt stands.
type State string

// States of an attempt.
const (
	Admitted         State = "admitted"          // admitted by the pacer, in flight
	Confirmed        State = "confirmed"         // answered by the server: executed (2xx), or answered 3xx/304
	Accepted         State = "accepted"          // accepted by the server, not yet executed (202)
	RejectedUpstream State = "rejected_upstream" // refused by the server (429, 4xx)
	Failed           State = "failed"            // no usable answer: network error, 5xx
	RejectedLocal    State = "rejected_local"    // refused by mcp-quota; nothing was sent
	Cached           State = "cached"            // answered by mcp-quota from its last answer; nothing was sent
	Interrupted      State = "interrupted"       // its process ended before it finished
	Reserved         State = "reserved"          // a slot of a lease: counted and in flight, not yet reported (see Reserve)
	Released         State = "released"          // a slot of a lease that was never reported: counted, nothing known of it
)

// A GateSource is what closed a gate. It is never a policy's name: a policy named "circuit" is not the circuit
// breaker.
type GateSource string

// Sources of a gate.
const (
	RetryAfterGate    GateSource = "retry-after"    // the upstream's Retry-After (or a vendor's reset on a refusal)
	BackoffGate       GateSource = "backoff"        // exponential backoff after a refusal or failure without a signal
	CircuitGate       GateSource = "circuit"        // the circuit breaker, open after failures in a row
	AbnormalUsageGate GateSource = "abnormal-usage" // the upstream said the usage looks abnormal
)

// A Transport is how a call reached mcp-quota. Its text is what the
// activity shows and the store keeps.
type Transport string

// Transports of a call.
const (
	Stdio   Transport = "stdio"    // an MCP client over standard input and output
	MCPHTTP Transport = "mcp-http" // an MCP client over Streamable HTTP
	REST    Transport = "rest"     // the REST gateway
)

// A WarningKind is what a warning warns of.
type WarningKind string

// Kinds of warning.
const (
	HiddenLimitWarning   WarningKind = "hidden-limit"   // a limit never announced, inferred from a refusal
	AbnormalUsageWarning WarningKind = "abnormal-usage" // the upstream said the usage looks abnormal
	CircuitOpenWarning   WarningKind = "circuit-open"   // the circuit breaker opened, for the key or one route
	PolicyBoundWarning   WarningKind = "policy-bound"   // the upstream announced more policies than are kept for one key: the least restrictive were folded
	WindowEdgeWarning    WarningKind = "window-edge"    // a refusal a known policy's window explains: a send reached the upstream later than the log's margin allowed
)

// An Attempt is one try to reach an upstream, or a call refused before
// any try (State RejectedLocal) or answered from a stored copy (Cached). It
// is a value; zero times and statuses mean "not yet" or "never".
type Attempt struct {
	ID            int64         // assigned by InsertAttempt
	CallID        string        // the call it belongs to; its attempts share it
	Attempt       int           // 1, 2, … per call
	Key           string        // the key it spends
	Caller        string        // who asked
	Transport     Transport     // Stdio, MCPHTTP or REST
	Method        string        // HTTP method
	Target        string        // path and query below the key's base URL, credential-free
	Digest        string        // identifies identical requests, for the loop guard
	Bytes         int64         // the bytes the request carries (its body's length, known before sending); 0 when none or unknown
	State         State         // Admitted, Confirmed, … (the constants above)
	Reason        reason.Reason // why it waited, was refused, failed or ended so, as data (reason.Said for one kept as words only)
	Probe         bool          // the one call let through to get a fresh answer
	At            time.Time     // admitted or refused at
	Wait          time.Duration // spent waiting for admission
	SentAt        time.Time     // when the request left
	AnsweredAt    time.Time     // when the answer came
	Status        int           // the upstream's HTTP status
	InFlightUntil time.Time     // in flight until then; zero once finished
	Instance      string        // the process that recorded it (host and process ID), set by the store
	// CallerReserves says that the key reserves part of its budget for
	// some callers (its keystore.Key.Reserves is not empty): only then
	// does the store number an admission in its caller's own log too,
	// for WindowOf, and keys without reservations are spared the cost.
	CallerReserves bool
	// Principal numbers an admission in its principal's own log, for
	// Reader.PrincipalWindow: set it for keys with shares, to the
	// principal the caller speaks for.
	Principal string
}

// A Window is what the sliding-window log holds of one key after a time.
// The zero Window is an empty one.
type Window struct {
	Count    int            // attempts admitted
	Oldest   time.Time      // the oldest of them; zero when Count is 0
	ByCaller map[string]int // Count per caller; nil when Count is 0
}

// A Send is one admitted attempt in a key's log, as Sends reports it.
type Send struct {
	ID         int64     // the attempt's ID
	At         time.Time // admitted at
	State      State     // its state now
	Status     int       // the upstream's answer; 0 while in flight or when none came
	AnsweredAt time.Time // when the answer came; zero while in flight or when none came
}

// A Flight is what a key has in flight: admitted attempts not yet
// finished, whose in-flight timeout has not run out. The zero Flight is nothing.
type Flight struct {
	Count  int       // attempts in flight
	Oldest time.Time // the earliest admission among them; zero when Count is 0
}

// ActivityFilter selects attempts for Activity.
type ActivityFilter struct {
	Key    string    // "" for every key
	Since  time.Time // attempts at or after; zero for all
	Cursor Cursor    // where the page starts: after the page that ended at it; the zero Cursor for the newest
	Limit  int       // at most this many; 0 means 100
}

// A SeenPolicy is a policy seen for a key (or inferred from a refusal), with
// its latest fresh observation. It is a value.
type SeenPolicy struct {
	Key string // the key it limits
	ratelimit.Observation
	ReceivedAt time.Time // of the latest observation (for a hidden limit: of its inference)
	// BasisAt is when the observing request was sent: later sends are
	// subtracted from Remaining. A hidden limit, which has no Remaining,
	// keeps there the start of the window it was inferred from.
	BasisAt time.Time
	Hidden  bool   // inferred from a refusal, never announced
	Route   string // method and path of the request that observed it
}

// An ObservationRecord is an observation as stored, with its context:
// which answer to which request said it, and when. It is a value.
type ObservationRecord struct {
	ID        int64  // assigned when stored
	Key       string // the key whose answer said it
	AttemptID int64  // the attempt answered; 0 when none
	ratelimit.Observation
	Status     int       // the answer's HTTP status
	ReceivedAt time.Time // when the answer came (local clock)
	ServerDate time.Time // the answer's Date; zero when it had none
	FromCache  bool      // the answer came from a cache: not a fresh observation
	Method     string    // of the request
	Target     string    // of the request, credential-free
}

// A Gate is a time before which nothing of its key (or of one policy of
// it, Scope) may be sent.
type Gate struct {
	Key    string        // the key it closes
	Scope  string        // "" for the whole key, else one route of it ("route GET /path")
	Until  time.Time     // closed until then
	Reason reason.Reason // why, as data (reason.Said for a gate kept as words only)
	Source GateSource    // what closed it
	SetAt  time.Time     // when it was closed
}

// KeyState is the pacing state of one key, shared by every process. The
// zero KeyState is a key never used.
type KeyState struct {
	Key            string        // the key's name
	LastAdmitAt    time.Time     // the latest admission, by any process
	Interval       time.Duration // slow-start spacing between admissions
	LastResponseAt time.Time     // the latest answer from the upstream
	Failures       int           // consecutive 429/5xx answers without guidance
	Opens          int           // times the circuit opened in a row
	HalfOpen       bool          // the next call is a probe
	ProbeAttempt   int64         // the probe in flight; 0 when none
	ProbeUntil     time.Time     // the probe's in-flight timeout
	// Latency is the longest time from admission to answer of the key's
	// calls answered since LatencySince, and PrevLatency the longest of
	// the period before: a send may reach the upstream that long after
	// its admission.
	Latency      time.Duration
	PrevLatency  time.Duration
	LatencySince time.Time
}

// A PathState is what the failures of one route of a key set: the
// backoff and circuit breaker of that route alone, for failures that
// said nothing of rate limits. The zero PathState is a route without
// failures.
type PathState struct {
	Key      string    // the key
	Scope    string    // the route, as a gate's Scope names it
	Failures int       // failures without guidance since its circuit last opened
	Opens    int       // times its circuit opened in a row
	HalfOpen bool      // its circuit opened: a failure once it closes opens it again
	LastAt   time.Time // its latest failure
}

// A Warning is something a key's users should hear about.
type Warning struct {
	ID     int64         // assigned when stored
	Key    string        // the key it is about
	At     time.Time     // when it was raised
	Kind   WarningKind   // what it warns of
	Reason reason.Reason // what it says, as data (reason.Said for a warning kept as words only)
}

// A StoredResponse is the last answer to a GET of one URL of a key, for
// conditional requests and the loop guard.
type StoredResponse struct {
	Key          string    // the key it was fetched with
	Target       string    // path and query below the key's base URL
	ETag         string    // the answer's ETag, for If-None-Match
	LastModified string    // its Last-Modified, for If-Modified-Since
	Status       int       // its HTTP status
	ContentType  string    // its Content-Type
	Body         []byte    // its body
	Digest       string    // identifies the body, to tell an unchanged answer
	StoredAt     time.Time // when it was stored
	Unchanged    int       // how many answers in a row were the same as the one before
	// Vary is what the answer varies on: the field names of its Vary,
	// lower case, one comma between them ("" for none). An answer that
	// varies on everything ("*") is never kept.
	Vary string
	// Varied is what the request that produced it sent for those fields
	// (see upstream.Varied): another request may be answered from it only
	// when it sends the same.
	Varied string
}

// A Bucket is how many attempts of one state a key saw in one step of a
// Timeline.
type Bucket struct {
	Start time.Time // the step's start
	State State     // Confirmed, RejectedLocal, … (reserved slots are not attempts yet)
	// Status is the upstream's answer for RejectedUpstream (a 429 and a
	// 404 count apart); 0 for every other state.
	Status int
	Count  int
}

// A Finished is how the call of a reserved slot, or an attempt admitted
// alone, ended: the attempt as FinishReserved (or FinishAttempt) records
// it, and the observations of its answer.
type Finished struct {
	Attempt      Attempt
	Observations []ObservationRecord
}
