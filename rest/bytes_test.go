package rest_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/leaktest"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/rest"
	"github.com/mcp-quota/mcp-quota/tools"
)

// bytesUpstream echoes the request URL and Authorization in its body,
// and shapes how the body comes back: in the content coding the request
// asked for (or one it did not), in several codings at once, in ranges,
// as a decompression bomb. It remembers the Accept-Encoding and Range
// fields it got.
type bytesUpstream struct {
	mu     sync.Mutex
	ae     []string // Accept-Encoding of each request
	ranges []string // Range of each request that had one
}

func (u *bytesUpstream) echo(r *http.Request) []byte {
	return fmt.Appendf(nil, `{"url":%q,"auth":%q,"pad":%q}`, "http://"+r.Host+r.URL.RequestURI(), r.Header.Get("Authorization"),
		strings.Repeat("p", 300))
}

func (u *bytesUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.ae = append(u.ae, r.Header.Get("Accept-Encoding"))
	if v := r.Header.Get("Range"); v != "" {
		u.ranges = append(u.ranges, v)
	}
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/echo": // in the first coding the request accepts
		ae := r.Header.Get("Accept-Encoding")
		switch {
		case strings.Contains(ae, "gzip"):
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(testkit.Gzip(u.echo(r)))
		case strings.Contains(ae, "deflate"):
			w.Header().Set("Content-Encoding", "deflate")
			w.Write(testkit.Zlib(u.echo(r)))
		default:
			w.Write(u.echo(r))
		}
	case "/stacked": // zlib, then gzip on top
		w.Header().Set("Content-Encoding", "deflate, gzip")
		w.Write(testkit.Gzip(testkit.Zlib(u.echo(r))))
	case "/rawdeflate": // "deflate" as raw deflate, as some servers send it
		w.Header().Set("Content-Encoding", "deflate")
		w.Write(testkit.RawDeflate(u.echo(r)))
	case "/br": // a coding nobody asked for
		w.Header().Set("Content-Encoding", "br")
		w.Write(u.echo(r))
	case "/bomb": // 4 MiB of padding, then the echo, gzip'd to a few KiB
		n, _ := strconv.Atoi(r.URL.Query().Get("pad"))
		if n == 0 {
			n = 4 << 20
		}
		w.Header().Set("Content-Encoding", "gzip")
		w.Write(testkit.Gzip(append(bytes.Repeat([]byte("a"), n), u.echo(r)...)))
	case "/range": // byte ranges of a body that holds the credential
		http.ServeContent(w, r, "echo.json", time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), bytes.NewReader(u.echo(r)))
	case "/partial": // a part, whatever was asked
		body := u.echo(r)
		w.Header().Set("Content-Range", fmt.Sprintf("bytes 0-9/%d", len(body)))
		w.WriteHeader(http.StatusPartialContent)
		w.Write(body[:10])
	default:
		http.NotFound(w, r)
	}
}

func (u *bytesUpstream) seen() (ae, ranges []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.ae...), append([]string(nil), u.ranges...)
}

var bytesKeys = testkit.Keys(
	testkit.Key{Name: "qk", BaseURL: "%[1]s/", SecretEnv: "UPSTREAM_SECRET", Auth: "query:api_key", MaxRate: 1000,
		Policies: testkit.Window(1000, time.Minute)},
	testkit.Key{Name: "bk", BaseURL: "%[1]s/", SecretEnv: "UPSTREAM_SECRET", Auth: "bearer", MaxRate: 1000},
	testkit.Key{Name: "open", BaseURL: "%[1]s/", Auth: "none", MaxRate: 1000},
)

func bytesStack(t *testing.T, u *bytesUpstream) *stack {
	cs := callersWith(map[string][]string{"sync": {"qk", "bk", "open"}, "agent": {"qk", "bk", "open"}, "stranger": {"open"}})
	return newStack(t, stackConfig{Upstream: u, Keys: bytesKeys, Callers: cs, Secret: awkwardSecret,
		Limits: rest.Limits{MaxBody: 1 << 20}, Fetch: tools.FetchLimits{MaxBody: 1 << 20}})
}

// TestWallsCompressedAnswers: whatever Accept-Encoding the caller sends,
// mcp-quota asks the upstream for the codings it decodes, and every
// answer — gzip, deflate (zlib or raw), stacked codings — reaches REST
// and MCP callers and the stored copy decoded, with the credential
// removed; an answer in a coding it did not ask for is refused; a
// compressed body is decoded no further than the body limits.
func TestWallsCompressedAnswers(t *testing.T) {
	t.Parallel()
	u := &bytesUpstream{}
	s := bytesStack(t, u)
	var out strings.Builder
	// Like curl --compressed: the caller asks for compressed answers and
	// decodes what comes itself (Go's client does not, when the caller
	// set the field).
	for _, key := range []string{"qk", "bk"} {
		for _, c := range []struct{ path, ae string }{{"/echo", "gzip"}, {"/echo", "deflate"}, {"/echo", "br, gzip;q=0.5"},
			{"/stacked", "gzip"}, {"/rawdeflate", ""}} {
			resp, b := s.do(t, "GET", "/k/"+key+c.path+"?x=1", syncToken, nil, "Accept-Encoding", c.ae)
			fmt.Fprintf(&out, "== REST %s %s (%s)\n%s %v\n%s\n", key, c.path, c.ae, resp.Status, resp.Header, b)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Encoding") != "" || !bytes.Contains(b, []byte("[redacted]")) {
				t.Errorf("REST %s %s with Accept-Encoding %q: %s, Content-Encoding %q, body %.200q; want 200, the body decoded, the credential replaced",
					key, c.path, c.ae, resp.Status, resp.Header.Get("Content-Encoding"), b)
			}
		}
	}
	mc := mcpClient(t, s, agentToken)
	for _, args := range []map[string]any{
		{"key": "qk", "path": "/echo?x=2", "headers": map[string]any{"Accept-Encoding": "gzip"}},
		{"key": "qk", "path": "/echo?x=2", "headers": map[string]any{"Accept-Encoding": "gzip"}}, // conditional on the kept copy
		{"key": "bk", "path": "/stacked", "headers": map[string]any{"Accept-Encoding": "gzip, deflate, br"}},
		{"key": "bk", "path": "/rawdeflate"},
	} {
		res, sc := callTool(t, mc, "fetch", args)
		j, _ := json.Marshal(res)
		fmt.Fprintf(&out, "== MCP fetch %v\n%s\n", args, j)
		if res.IsError || !strings.Contains(sc, "[redacted]") {
			t.Errorf("fetch %v: %s; want the body decoded with the credential replaced", args, sc)
		}
	}
	channels := map[string]string{"answers": out.String(), "log": s.Log.String()}
	for name, text := range leaktest.StateFiles(t, s.DBPath) {
		channels[name] = text
	}
	if !strings.Contains(channels["state file"]+channels["state file-wal"], `"pad":"ppp`) {
		t.Errorf("the kept copy is not in the state file, decoded: the scan would prove nothing")
	}
	leaktest.Scan(t, awkwardSecret, channels)
	ae, _ := u.seen()
	for _, v := range ae {
		if v != "gzip, deflate" {
			t.Errorf("the upstream was asked for Accept-Encoding %q; want mcp-quota's own %q whatever the caller sent", v, "gzip, deflate")
		}
	}

	// A coding mcp-quota did not ask for is refused, not passed on.
	resp, b := s.do(t, "GET", "/k/bk/br", syncToken, nil, "Accept-Encoding", "br")
	var p struct{ Code, Detail string }
	json.Unmarshal(b, &p)
	if resp.StatusCode != http.StatusBadGateway || p.Code != rest.CodeAnswerRefused || !strings.Contains(p.Detail, `"br"`) {
		t.Errorf("an answer in br: %s %s; want 502 %s naming the coding", resp.Status, b, rest.CodeAnswerRefused)
	}
	res, sc := callTool(t, mc, "fetch", map[string]any{"key": "bk", "path": "/br"})
	if !res.IsError || !strings.Contains(sc, `"code":"answerRefused"`) {
		t.Errorf("fetch of an answer in br: %s; want isError answerRefused", sc)
	}

	// A bomb: decoded no further than the body limit (1 MiB here). REST
	// ends the answer early (a cut body, never taken for a whole one);
	// fetch shows the first MiB, truncated.
	req, _ := http.NewRequest("GET", s.URL+"/k/bk/bomb", nil)
	req.Header.Set("Authorization", "Bearer "+syncToken)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		n, rerr := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if rerr == nil || n > 1<<20+64<<10 {
			t.Errorf("REST bomb: read %d bytes, error %v; want at most the 1 MiB limit and the answer ended early", n, rerr)
		}
	}
	_, sc = callTool(t, mc, "fetch", map[string]any{"key": "bk", "path": "/bomb"})
	if !strings.Contains(sc, `"truncated":true`) {
		t.Errorf("fetch of a bomb: %.300s; want a truncated body", sc)
	}
}

// TestWallsRanges: a caller cannot pick the bytes of a representation
// so that a range edge cuts the credential: for a key with a credential,
// Range and the fields like it never go upstream, the caller gets the
// whole representation scrubbed (200, Accept-Ranges: none), a partial
// answer the upstream sends anyway is refused, and a body cut at a bound
// the caller can steer (padding it chooses, before the credential) never
// ends in a piece of the credential. A key without a credential passes
// ranges on.
func TestWallsRanges(t *testing.T) {
	t.Parallel()
	u := &bytesUpstream{}
	s := bytesStack(t, u)
	var out, reassembled strings.Builder
	for _, key := range []string{"qk", "bk"} {
		for _, rg := range []string{"bytes=10-17", "bytes=18-25", "bytes=26-33", "bytes=34-60"} {
			resp, b := s.do(t, "GET", "/k/"+key+"/range", syncToken, nil, "Range", rg, "If-Range", "Mon, 30 Nov 2026 12:00:00 GMT",
				"Request-Range", rg, "X-Ms-Range", rg)
			fmt.Fprintf(&out, "== REST %s %s\n%s %v\n%s\n", key, rg, resp.Status, resp.Header, b)
			reassembled.Write(b)
			if resp.StatusCode != 200 || resp.Header.Get("Accept-Ranges") != "none" || !bytes.Contains(b, []byte("[redacted]")) {
				t.Errorf("REST %s Range %s: %s Accept-Ranges %q %.120q; want 200, the whole body scrubbed, Accept-Ranges: none",
					key, rg, resp.Status, resp.Header.Get("Accept-Ranges"), b)
			}
		}
	}
	mc := mcpClient(t, s, agentToken)
	for _, rg := range []string{"bytes=10-17", "bytes=18-25", "bytes=26-33"} {
		res, sc := callTool(t, mc, "fetch", map[string]any{"key": "qk", "path": "/range", "headers": map[string]any{"Range": rg}})
		var r struct{ Body string }
		json.Unmarshal([]byte(sc), &r)
		reassembled.WriteString(r.Body)
		j, _ := json.Marshal(res)
		fmt.Fprintf(&out, "== MCP fetch %s\n%s\n", rg, j)
		if res.IsError || !strings.Contains(r.Body, "[redacted]") {
			t.Errorf("fetch with Range %s: %.300s; want the whole body scrubbed", rg, sc)
		}
	}
	if _, ranges := u.seen(); len(ranges) > 0 {
		t.Errorf("the upstream got Range %q for keys with a credential; want none", ranges)
	}

	// Padding the caller chooses, so that the 1 MiB bound on a decoded
	// body falls inside the credential: the caller gets a cut body, and
	// no piece of the credential at its end.
	host := strings.TrimPrefix(s.UpstreamURL, "http://")
	for _, cut := range []int{3, 8, 15} {
		prefix := fmt.Sprintf(`{"url":"http://%s/bomb?pad=%07d","auth":"Bearer `, host, 0)
		pad := 1<<20 - cut - len(prefix) // the bound falls cut bytes into the key
		b := getCut(t, s.URL+fmt.Sprintf("/k/bk/bomb?pad=%07d", pad), syncToken)
		reassembled.Write(b[max(len(b)-200, 0):])
		if len(b) < 1<<20-64<<10 {
			t.Errorf("a body cut at the bound: %d bytes came; want about 1 MiB", len(b))
		}
		for n := 2; n < len(awkwardSecret); n++ {
			if bytes.HasSuffix(b, []byte(awkwardSecret[:n])) {
				t.Errorf("a body cut at the bound, %d bytes into the key, ends in its first %d bytes", cut, n)
			}
		}
	}

	// A partial answer to a request for the whole is refused.
	resp, b := s.do(t, "GET", "/k/qk/partial", syncToken, nil)
	var p struct{ Code string }
	json.Unmarshal(b, &p)
	if resp.StatusCode != http.StatusBadGateway || p.Code != rest.CodeAnswerRefused {
		t.Errorf("a 206 to a request for the whole: %s %s; want 502 %s", resp.Status, b, rest.CodeAnswerRefused)
	}
	// Without a credential, a range is the caller's to ask for.
	resp, b = s.do(t, "GET", "/k/open/range", syncToken, nil, "Range", "bytes=0-4")
	if resp.StatusCode != http.StatusPartialContent || string(b) != `{"url` {
		t.Errorf("a key without a credential: %s %q; want 206 with the range", resp.Status, b)
	}

	leaktest.Scan(t, awkwardSecret, map[string]string{"answers": out.String(), "the pieces, reassembled": reassembled.String(),
		"log": s.Log.String()})
}

// getCut GETs url with token and returns what came of the body, however
// the answer ended.
func getCut(t *testing.T, url, token string) []byte {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}
