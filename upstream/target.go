package upstream

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// A PathError reports a path that would leave the key's base URL.
type PathError struct {
	Path   string
	Reason string
}

func (e *PathError) Error() string {
	return fmt.Sprintf("path %q is refused: %s", e.Path, e.Reason)
}

// ErrBadPath matches every *PathError with errors.Is.
var ErrBadPath = errors.New("bad path")

// Is makes errors.Is(err, ErrBadPath) true for a *PathError.
func (e *PathError) Is(target error) bool { return target == ErrBadPath }

// Resolve returns the URL that path (relative to base, optionally with a
// query) names, with query added. It refuses anything that could leave
// base's path or host: absolute URLs and scheme-relative paths, "." and
// ".." segments, encoded slashes, backslashes, dots and NULs, "@" in the
// path, backslashes, fragments, and control characters. Bytes a query
// may not hold raw (spaces, quotes, non-ASCII) are percent-encoded. base
// must end in "/".
func Resolve(base *url.URL, path string, query url.Values) (*url.URL, error) {
	refuse := func(reason string) (*url.URL, error) { return nil, &PathError{Path: path, Reason: reason} }
	for _, c := range path {
		if c < 0x20 || c == 0x7f {
			return refuse("it contains control characters")
		}
	}
	rawPath, rawQuery, _ := strings.Cut(path, "?")
	switch {
	case strings.Contains(path, "\\"):
		return refuse("backslashes are not allowed")
	case strings.Contains(rawPath, "@"):
		return refuse("'@' is not allowed in the path")
	case strings.Contains(path, "#"):
		return refuse("fragments are not allowed")
	case strings.HasPrefix(path, "//"):
		return refuse("scheme-relative URLs are not allowed")
	}
	// A scheme ends the first segment ("http:", "javascript:"), whether
	// or not the caller began the path with "/".
	if first, _, _ := strings.Cut(strings.TrimPrefix(rawPath, "/"), "/"); strings.Contains(first, ":") {
		return refuse("absolute URLs are not allowed")
	}
	lower := strings.ToLower(rawPath)
	if strings.Contains(lower, "%2f") || strings.Contains(lower, "%5c") || strings.Contains(lower, "%2e") || strings.Contains(lower, "%00") {
		return refuse("encoded slashes, backslashes, dots and NULs are not allowed")
	}
	segs := strings.Split(strings.TrimPrefix(rawPath, "/"), "/")
	for _, s := range segs {
		if s == ".." || s == "." {
			return refuse("'.' and '..' segments are not allowed")
		}
	}
	unescaped, err := url.PathUnescape(rawPath)
	if err != nil {
		return refuse("it is not a valid URL path")
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return refuse("its query string is not valid")
	}
	for k, vs := range query {
		for _, v := range vs {
			q.Add(k, v)
		}
	}
	u := *base
	u.Path = base.Path + strings.TrimPrefix(unescaped, "/")
	u.RawPath = ""
	if escaped := strings.TrimPrefix(rawPath, "/"); escaped != strings.TrimPrefix(unescaped, "/") {
		u.RawPath = base.EscapedPath() + escaped
	}
	u.RawQuery = escapeQuery(rawQuery) // as the caller wrote it, when nothing is added
	if len(query) > 0 {
		u.RawQuery = q.Encode()
	}
	if !strings.HasPrefix(u.Path, base.Path) {
		return refuse("it leaves the key's base path")
	}
	return &u, nil
}

// escapeQuery percent-encodes the bytes of q that a query may not hold
// raw (RFC 3986 §3.4: query = *( pchar / "/" / "?" ), plus "%" of the
// caller's own escapes), so that nothing a caller sends can break the
// request line.
func escapeQuery(q string) string {
	ok := func(c byte) bool {
		return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			strings.IndexByte("-._~!$&'()*+,;=:@/?%", c) >= 0
	}
	clean := true
	for i := 0; i < len(q); i++ {
		clean = clean && ok(q[i])
	}
	if clean {
		return q
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(q); i++ {
		if c := q[i]; ok(c) {
			b.WriteByte(c)
		} else {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}

// Target returns u's path and query relative to base, for the activity:
// what the caller asked for, without the credential.
func Target(base, u *url.URL) string {
	p := u.EscapedPath()
	if u.Host == base.Host {
		p = strings.TrimPrefix(p, strings.TrimSuffix(base.EscapedPath(), "/"))
	} else {
		p = u.Host + p
	}
	if u.RawQuery != "" {
		p += "?" + u.RawQuery
	}
	return p
}
