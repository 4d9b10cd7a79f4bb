package testkit

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// LeakyUpstream is an upstream that repeats its credential everywhere an
// upstream can, for the tests that scan what mcp-quota gives back and
// keeps for a key's credential:
//   - /v1/items: a Link to the next page that repeats the request's
//     query, a field that repeats the request URL percent-encoded, and a
//     body that echoes the query, in base64 too, and the Authorization;
//   - /slash: a same-host redirect to /slash/ that keeps the query;
//   - /via: a redirect through /hop, a URL carrying the query, on to
//     AllowedURL's /landing;
//   - /to-allowed-with-key: a redirect to AllowedURL's /landing with
//     the query;
//   - /gz: the query in a body compressed with gzip when the request
//     accepts it, as most servers do;
//   - /range: the query in a body served in byte ranges.
type LeakyUpstream struct {
	AllowedURL string // where /via and /to-allowed-with-key lead
}

func (u *LeakyUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	full := "http://" + r.Host + r.URL.RequestURI()
	switch r.URL.Path {
	case "/v1/items":
		next := r.URL.Query()
		next.Set("page", "2")
		w.Header().Set("Link", "<"+r.URL.Path+"?"+next.Encode()+`>; rel="next"`)
		w.Header().Set("X-Echo-Url", url.QueryEscape(full))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"items":[1,2],"you_sent":%q,"query":%q,"b64":%q}`, r.Header.Get("Authorization"), r.URL.RawQuery,
			base64.StdEncoding.EncodeToString([]byte(r.URL.RawQuery)))
	case "/slash":
		http.Redirect(w, r, "/slash/?"+r.URL.RawQuery, http.StatusMovedPermanently)
	case "/slash/":
		io.WriteString(w, "ok")
	case "/via":
		http.Redirect(w, r, "/hop?"+r.URL.RawQuery, http.StatusFound)
	case "/hop":
		http.Redirect(w, r, u.AllowedURL+"/landing", http.StatusFound)
	case "/to-allowed-with-key":
		http.Redirect(w, r, u.AllowedURL+"/landing?"+r.URL.RawQuery, http.StatusFound)
	case "/gz":
		body := fmt.Sprintf(`{"query":%q}`, r.URL.RawQuery)
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(Gzip([]byte(body)))
			return
		}
		io.WriteString(w, body)
	case "/range":
		http.ServeContent(w, r, "q.json", time.Time{}, strings.NewReader(fmt.Sprintf(`{"query":%q}`, r.URL.RawQuery)))
	default:
		http.NotFound(w, r)
	}
}
