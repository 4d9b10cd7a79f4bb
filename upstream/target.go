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
// base's path or host: absolute URLs and scheme-relative paths, "..",
// "." segments, encoded slashes and backslashes, "@", backslashes,
// fragments, and control characters. base must end in "/".
func Resolve(base *url.URL, path string, query url.Values) (*url.URL, error) {
	refuse := func(reason string) (*url.URL, error) { return nil, &PathError{Path: path, Reason: reason} }
	for _, c := range path {
		if c < 0x20 || c == 0x7f {
			return refuse("it contains control characters")
		}
	}
	switch {
	case strings.Contains(path, "\\"):
		return refuse("backslashes are not allowed")
	case strings.Contains(path, "@"):
		return refuse("'@' is not allowed")
	case strings.Contains(path, "#"):
		return refuse("fragments are not allowed")
	case strings.HasPrefix(path, "//"):
		return refuse("scheme-relative URLs are not allowed; give a path below the key's base URL")
	}
	rawPath, rawQuery, _ := strings.Cut(path, "?")
	if i := strings.Index(rawPath, ":"); i >= 0 && !strings.Contains(rawPath[:i], "/") {
		return refuse("absolute URLs are not allowed; give a path below the key's base URL")
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
	u.RawQuery = rawQuery // as the caller wrote it, when nothing is added
	if len(query) > 0 {
		u.RawQuery = q.Encode()
	}
	if !strings.HasPrefix(u.Path, base.Path) {
		return refuse("it leaves the key's base path")
	}
	return &u, nil
}

// Target returns u's path and query relative to base, for the activity:
// what the caller asked for, without the credential.
func Target(base, u *url.URL) string {
	p := strings.TrimPrefix(u.EscapedPath(), strings.TrimSuffix(base.EscapedPath(), "/"))
	if u.Host != base.Host {
		p = u.Host + p
	}
	if u.RawQuery != "" {
		p += "?" + u.RawQuery
	}
	return p
}
