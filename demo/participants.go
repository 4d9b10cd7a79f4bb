package demo

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// baseTime is the instant the data set is generated relative to: every
// participant was updated in the 30 days before it.
var baseTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Page sizes of GET /v1/participants.
const (
	defaultLimit = 50
	maxLimit     = 500
)

// participant is one record of the data set, as the API serves it.
type participant struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Email     string    `json:"email"`
	UpdatedAt time.Time `json:"updatedAt"`
}

var (
	firstNames = []string{"Anna", "Ben", "Clara", "David", "Elif", "Felix", "Greta", "Hannes",
		"Ida", "Jonas", "Kira", "Lukas", "Mia", "Noah", "Olga", "Paul",
		"Quirin", "Rosa", "Samir", "Tilda", "Umut", "Vera", "Wim", "Yara"}
	lastNames = []string{"Albrecht", "Becker", "Celik", "Dietrich", "Engel", "Fischer", "Graf", "Hoffmann",
		"Ivanova", "Jung", "Keller", "Lang", "Meyer", "Nowak", "Otto", "Peters",
		"Quast", "Richter", "Schmidt", "Thiel", "Ulrich", "Vogel", "Wagner", "Zimmermann"}
)

// generate returns n participants, the same for the same n.
func generate(n int) []participant {
	const spread = 30 * 24 * 60 * 60 // seconds in 30 days
	ps := make([]participant, n)
	for i := range ps {
		h := splitmix64(uint64(i))
		first := firstNames[h%uint64(len(firstNames))]
		last := lastNames[(h>>8)%uint64(len(lastNames))]
		ps[i] = participant{
			ID:        participantID(i + 1),
			Name:      first + " " + last,
			Email:     fmt.Sprintf("%s.%s.%d@example.com", strings.ToLower(first), strings.ToLower(last), i+1),
			UpdatedAt: baseTime.Add(-time.Duration(1+(h>>16)%spread) * time.Second),
		}
	}
	return ps
}

func participantID(n int) string { return fmt.Sprintf("p-%06d", n) }

// splitmix64 is a well-mixed hash of x (Steele, Lea, Flood 2014).
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// page is the answer of GET /v1/participants. NextCursor is null on the
// last page.
type page struct {
	Items      []participant `json:"items"`
	NextCursor *string       `json:"next_cursor"`
}

// listParticipants answers GET /v1/participants: the participants in id
// order, filtered by updatedSince (RFC 3339, inclusive), limit per page,
// continued by the opaque cursor of the previous page.
func (a *API) listParticipants(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := defaultLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxLimit {
			writeProblem(w, http.StatusBadRequest, "badRequest",
				fmt.Sprintf("limit must be a whole number from 1 to %d, not %q.", maxLimit, s))
			return
		}
		limit = n
	}
	var since time.Time
	if s := q.Get("updatedSince"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			writeProblem(w, http.StatusBadRequest, "badRequest",
				fmt.Sprintf("updatedSince must be an RFC 3339 time such as 2025-12-24T18:00:00Z, not %q.", s))
			return
		}
		since = t
	}
	start := 0
	if s := q.Get("cursor"); s != "" {
		n, ok := decodeCursor(s, len(a.data))
		if !ok {
			writeProblem(w, http.StatusBadRequest, "badRequest",
				"cursor is not one this API issued; start again without it.")
			return
		}
		start = n
	}
	match := func(p participant) bool { return !p.UpdatedAt.Before(since) }

	res := page{Items: []participant{}}
	i := start
	for ; i < len(a.data) && len(res.Items) < limit; i++ {
		if match(a.data[i]) {
			res.Items = append(res.Items, a.data[i])
		}
	}
	for ; i < len(a.data); i++ {
		if match(a.data[i]) {
			c := encodeCursor(i)
			res.NextCursor = &c
			next := url.Values{"limit": {strconv.Itoa(limit)}, "cursor": {c}}
			if s := q.Get("updatedSince"); s != "" {
				next.Set("updatedSince", s)
			}
			setNextLink(w.Header(), r.URL.Path+"?"+next.Encode())
			break
		}
	}
	body, err := json.Marshal(res)
	if err != nil {
		panic(err)
	}
	writeRepresentation(w, r, body, nil)
}

// A cursor is the index of the first record the next page looks at,
// encoded so that callers treat it as opaque.
func encodeCursor(i int) string {
	return base64.RawURLEncoding.EncodeToString([]byte("at:" + strconv.Itoa(i)))
}

func decodeCursor(s string, n int) (int, bool) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return 0, false
	}
	digits, ok := strings.CutPrefix(string(b), "at:")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(digits)
	if err != nil || i < 0 || i > n {
		return 0, false
	}
	return i, true
}

// getParticipant answers GET /v1/participants/{id}.
func (a *API) getParticipant(w http.ResponseWriter, r *http.Request, id string) {
	digits, ok := strings.CutPrefix(id, "p-")
	n, err := strconv.Atoi(digits)
	if !ok || err != nil || n < 1 || n > len(a.data) || participantID(n) != id {
		writeProblem(w, http.StatusNotFound, "notFound", fmt.Sprintf("There is no participant %q.", id))
		return
	}
	body, err := json.Marshal(a.data[n-1])
	if err != nil {
		panic(err)
	}
	writeRepresentation(w, r, body, nil)
}

// createParticipant answers POST /v1/participants: it echoes the new
// participant with an id and updatedAt, 201 and a Location. The data
// set is not changed, so pages and ETags stay stable.
func (a *API) createParticipant(w http.ResponseWriter, r *http.Request, now time.Time) {
	var in struct {
		Name  string `json:"name"`
		Email string `json:"email"`
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	if err := dec.Decode(&in); err != nil || in.Name == "" || in.Email == "" {
		writeProblem(w, http.StatusBadRequest, "badRequest",
			`Send a JSON object with a non-empty "name" and "email".`)
		return
	}
	a.mu.Lock()
	a.created++
	n := len(a.data) + a.created
	a.mu.Unlock()
	p := participant{ID: participantID(n), Name: in.Name, Email: in.Email, UpdatedAt: now.UTC().Truncate(time.Second)}
	setLocation(w.Header(), "/v1/participants/"+p.ID)
	writeJSON(w, http.StatusCreated, p)
}
