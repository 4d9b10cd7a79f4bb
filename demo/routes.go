package demo

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Sizes of GET /v1/report.
const (
	defaultReportBytes = 1 << 20
	maxReportBytes     = 16 << 20
)

// route executes an admitted request.
func (a *API) route(w http.ResponseWriter, r *http.Request, now time.Time) {
	p := r.URL.Path
	isGet := r.Method == http.MethodGet || r.Method == http.MethodHead
	switch {
	case p == "/v1/participants":
		switch {
		case isGet:
			a.listParticipants(w, r)
		case r.Method == http.MethodPost:
			a.createParticipant(w, r, now)
		default:
			notAllowed(w, r, http.MethodGet, http.MethodHead, http.MethodPost)
		}
	case strings.HasPrefix(p, "/v1/participants/") && !strings.Contains(p[len("/v1/participants/"):], "/"):
		if !isGet {
			notAllowed(w, r, http.MethodGet, http.MethodHead)
			return
		}
		a.getParticipant(w, r, p[len("/v1/participants/"):])
	case p == "/v1/report":
		if !isGet {
			notAllowed(w, r, http.MethodGet, http.MethodHead)
			return
		}
		report(w, r)
	case p == "/v1/echo":
		echo(w, r)
	default:
		writeProblem(w, http.StatusNotFound, "notFound", fmt.Sprintf("There is no endpoint %s.", p))
	}
}

func notAllowed(w http.ResponseWriter, r *http.Request, methods ...string) {
	setAllow(w.Header(), methods...)
	writeProblem(w, http.StatusMethodNotAllowed, "methodNotAllowed",
		fmt.Sprintf("%s does not accept %s.", r.URL.Path, r.Method))
}

// report answers GET /v1/report?bytes=N with a JSON document of exactly
// N bytes (at least the size of an empty report), the same for the same
// N: {"report":"demo","rows":[{"row":0,"text":"…"},…],"pad":"xxx"}.
func report(w http.ResponseWriter, r *http.Request) {
	n := defaultReportBytes
	if s := r.URL.Query().Get("bytes"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > maxReportBytes {
			writeProblem(w, http.StatusBadRequest, "badRequest",
				fmt.Sprintf("bytes must be a whole number from 1 to %d, not %q.", maxReportBytes, s))
			return
		}
		n = v
	}
	writeRepresentation(w, r, reportBody(n), nil)
}

func reportBody(n int) []byte {
	const (
		head = `{"report":"demo","rows":[`
		tail = `],"pad":""}`
		text = `,"text":"Participants synchronised without a single rejected call; quota spent evenly."}`
	)
	b := make([]byte, 0, max(n, len(head)+len(tail)))
	b = append(b, head...)
	var row []byte
	for i := 0; ; i++ {
		row = row[:0]
		if i > 0 {
			row = append(row, ',')
		}
		row = append(row, `{"row":`...)
		row = strconv.AppendInt(row, int64(i), 10)
		row = append(row, text...)
		if len(b)+len(row)+len(tail) > n {
			break
		}
		b = append(b, row...)
	}
	b = append(b, `],"pad":"`...)
	for len(b) < n-len(`"}`) {
		b = append(b, 'x')
	}
	return append(b, `"}`...)
}

// echoed is the answer of /v1/echo: what the request looked like when it
// arrived, except its credentials.
type echoed struct {
	Method               string              `json:"method"`
	Path                 string              `json:"path"`
	Query                map[string][]string `json:"query"`
	Host                 string              `json:"host"`
	Headers              map[string][]string `json:"headers"`
	AuthorizationPresent bool                `json:"authorization_present"`
	Body                 string              `json:"body,omitempty"`
}

// credentialHeaders are never echoed.
var credentialHeaders = []string{"Authorization", "Proxy-Authorization"}

// conditionalHeaders are echoed but left out of the ETag, so that sending
// a tag back can match it.
var conditionalHeaders = []string{"If-None-Match", "If-Match", "If-Modified-Since", "If-Unmodified-Since"}

// echo answers /v1/echo (any method) with the request's method, path,
// query, host and header fields, except credentials: for Authorization
// it says only whether one was present. A body (up to 1 MiB) is echoed
// as text. GET and HEAD answers carry an ETag like every other GET.
func echo(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "badRequest", "The request body could not be read.")
		return
	}
	e := echoed{
		Method:               r.Method,
		Path:                 r.URL.Path,
		Query:                r.URL.Query(),
		Host:                 r.Host,
		Headers:              maps.Clone(r.Header),
		AuthorizationPresent: r.Header.Get("Authorization") != "",
		Body:                 string(body),
	}
	if e.Headers == nil {
		e.Headers = map[string][]string{}
	}
	for _, h := range credentialHeaders {
		delete(e.Headers, h)
	}
	full, err := json.Marshal(e)
	if err != nil {
		panic(err)
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		setContentType(w.Header(), "application/json; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		w.Write(full)
		return
	}
	e.Headers = maps.Clone(e.Headers)
	for _, h := range conditionalHeaders {
		delete(e.Headers, h)
	}
	tagged, err := json.Marshal(e)
	if err != nil {
		panic(err)
	}
	writeRepresentation(w, r, full, tagged)
}
