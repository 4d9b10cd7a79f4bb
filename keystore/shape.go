package keystore

import (
	"encoding"
	"fmt"
	"github.com/mcp-quota/mcp-quota/internal/spelling"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// This file checks a configuration's shape before its values: every field
// is one the file format knows, of the type it expects, and it finds the
// line each field of the file is on, so that a mistake names the line of
// the field itself.

// checkShape walks v, a value TOML decoded into any, against t, the Go
// type it is decoded into, and reports every unknown field and every
// value of the wrong type. path is v's place in the file, e.g.
// "keys[0].policies[1]"; section is path without indices.
func checkShape(path, section string, v any, t reflect.Type, out *[]*ConfigError) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	field := path
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		field = path[i+1:]
	}
	if reflect.PointerTo(t).Implements(reflect.TypeFor[encoding.TextUnmarshaler]()) {
		checkText(path, field, v, t, out)
		return
	}
	ok := true
	switch t.Kind() {
	case reflect.String:
		_, ok = v.(string)
	case reflect.Bool:
		_, ok = v.(bool)
	case reflect.Int, reflect.Int64:
		_, ok = v.(int64)
	case reflect.Float64:
		switch v.(type) {
		case int64, float64:
		default:
			ok = false
		}
	case reflect.Slice:
		ok = checkList(path, section, v, t, out)
	case reflect.Struct:
		ok = checkTable(path, section, v, t, out)
	}
	if !ok {
		*out = append(*out, mismatch(path, field, t, v))
	}
}

// checkText checks v, written as a string or a number, against t, a type
// that reads itself from text (a duration, say).
func checkText(path, field string, v any, t reflect.Type, out *[]*ConfigError) {
	var s string
	switch x := v.(type) {
	case string:
		s = x
	case int64:
		s = strconv.FormatInt(x, 10)
	case float64:
		s = strconv.FormatFloat(x, 'g', -1, 64)
	default:
		*out = append(*out, mismatch(path, field, t, v))
		return
	}
	if err := reflect.New(t).Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(s)); err != nil {
		*out = append(*out, &ConfigError{Field: path, Msg: err.Error()})
	}
}

// checkList checks each element of v against t's element type; it
// reports whether v is a list at all.
func checkList(path, section string, v any, t reflect.Type, out *[]*ConfigError) bool {
	var list []any
	switch x := v.(type) {
	case []any:
		list = x
	case []map[string]any:
		for _, m := range x {
			list = append(list, m)
		}
	default:
		return false
	}
	for i, e := range list {
		checkShape(fmt.Sprintf("%s[%d]", path, i), section, e, t.Elem(), out)
	}
	return true
}

// checkTable checks each field of v against the struct type t, in the
// order of their names; it reports whether v is a table at all.
func checkTable(path, section string, v any, t reflect.Type, out *[]*ConfigError) bool {
	m, isMap := v.(map[string]any)
	if !isMap {
		return false
	}
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		sub, subSection := name, name
		if path != "" {
			sub, subSection = path+"."+name, section+"."+name
		}
		f, known := fieldByTag(t, name)
		if !known {
			*out = append(*out, unknownField(sub, subSection, name, m[name], t))
			continue
		}
		checkShape(sub, subSection, m[name], f.Type, out)
	}
	return true
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		if f := t.Field(i); strings.Split(f.Tag.Get("toml"), ",")[0] == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// likelyFixes are the mistakes people make, by section and field.
var likelyFixes = map[string]string{
	"key":                    "[[keys]]",
	"caller":                 "[[callers]]",
	"policies":               "[[keys.policies]], under a [[keys]] entry",
	"keys.policy":            "[[keys.policies]]",
	"keys.token":             "secret_env or secret_file (the API key is read from there, never written here)",
	"keys.api_key":           "secret_env or secret_file (the API key is read from there, never written here)",
	"keys.secret_key":        "secret_env or secret_file",
	"keys.url":               "base_url",
	"keys.base":              "base_url",
	"keys.policies.limit":    "quota",
	"keys.policies.period":   "window",
	"keys.policies.interval": "window",
	"callers.token":          "token_env or token_file (the token is read from there, never written here)",
	"callers.secret_env":     "token_env",
	"callers.secret_file":    "token_file",
	"callers.key":            "keys, a list: keys = [\"example\"]",
}

func unknownField(path, section, name string, v any, t reflect.Type) *ConfigError {
	what := "unknown field " + name
	switch v.(type) {
	case []map[string]any:
		what = "unknown table [[" + section + "]]"
	case map[string]any:
		what = "unknown table [" + section + "]"
	}
	if fix, ok := likelyFixes[section]; ok {
		return &ConfigError{Field: path, Msg: what + ": did you mean " + fix + "?"}
	}
	var known []string
	for i := range t.NumField() {
		if tag := strings.Split(t.Field(i).Tag.Get("toml"), ",")[0]; tag != "" && tag != "secret" {
			known = append(known, tag)
		}
	}
	if best := spelling.Closest(name, known); best != "" {
		return &ConfigError{Field: path, Msg: fmt.Sprintf("%s: did you mean %s?", what, best)}
	}
	return &ConfigError{Field: path, Msg: fmt.Sprintf("%s: the fields here are %s", what, strings.Join(known, ", "))}
}

// mismatch says what a field expects, what it got, and, when the value
// would do written the other way, how to write it.
func mismatch(path, field string, t reflect.Type, v any) *ConfigError {
	want := expected(t)
	got := tomlKind(v)
	msg := fmt.Sprintf("%s must be %s, not %s", field, want, got)
	s, isString := v.(string)
	switch {
	case isString && (t.Kind() == reflect.Int || t.Kind() == reflect.Int64):
		if _, err := strconv.ParseInt(s, 10, 64); err == nil {
			msg += fmt.Sprintf(": write %s = %s, without quotes", field, s)
		}
	case isString && t.Kind() == reflect.Float64:
		if _, err := strconv.ParseFloat(s, 64); err == nil {
			msg += fmt.Sprintf(": write %s = %s, without quotes", field, s)
		}
	case isString && t.Kind() == reflect.Bool:
		if s == "true" || s == "false" {
			msg += fmt.Sprintf(": write %s = %s, without quotes", field, s)
		}
	case t.Kind() == reflect.String:
		if n, ok := v.(int64); ok {
			msg += fmt.Sprintf(": write %s = \"%d\", in quotes", field, n)
		}
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		if isString {
			msg += fmt.Sprintf(": write %s = [%q]", field, s)
		}
	}
	return &ConfigError{Field: path, Msg: msg}
}

func expected(t reflect.Type) string {
	if t == reflect.TypeFor[duration]() {
		return `a duration such as "60s"`
	}
	switch t.Kind() {
	case reflect.String:
		return "text in quotes"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64:
		return "a whole number"
	case reflect.Float64:
		return "a number"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Struct {
			return "a list of tables"
		}
		return "a list in [brackets]"
	case reflect.Struct:
		return "a table"
	}
	return t.String()
}

func tomlKind(v any) string {
	switch v.(type) {
	case string:
		return "text in quotes"
	case int64, float64:
		return "a number"
	case bool:
		return "true or false"
	case []any:
		return "a list"
	case []map[string]any:
		return "a list of tables"
	case map[string]any:
		return "a table"
	case time.Time:
		return "a date"
	}
	return fmt.Sprintf("%T", v)
}

// fieldLines maps each table and field of a file, as "keys[1].policies[0]"
// or "keys[1].base_url", to the line it is on. It reads the lines as
// TOML writes tables and keys; what it cannot place (a field inside an
// inline table or a multi-line value) falls back to its table's line.
type fieldLines map[string]int

var (
	tableHeader = regexp.MustCompile(`^\s*(\[\[?)\s*([A-Za-z0-9_."-]+?)\s*\]\]?\s*(#.*)?$`)
	assignment  = regexp.MustCompile(`^\s*("[^"]*"|[A-Za-z0-9_.-]+)\s*=`)
)

// indexLines places each table and field of the TOML file data on its
// line (see fieldLines).
func indexLines(data []byte) fieldLines {
	lines := fieldLines{}
	count := map[string]int{} // array-of-tables path (resolved parents) -> entries so far
	cur := ""
	for n, line := range strings.Split(string(data), "\n") {
		if m := tableHeader.FindStringSubmatch(line); m != nil {
			segs := strings.Split(strings.ReplaceAll(m[2], `"`, ""), ".")
			cur = ""
			for i, seg := range segs {
				p := seg
				if cur != "" {
					p = cur + "." + seg
				}
				last := i == len(segs)-1
				switch {
				case last && m[1] == "[[":
					if _, ok := lines[p]; !ok {
						lines[p] = n + 1
					}
					cur = fmt.Sprintf("%s[%d]", p, count[p])
					count[p]++
				case count[p] > 0:
					cur = fmt.Sprintf("%s[%d]", p, count[p]-1)
				default:
					cur = p
				}
			}
			if _, ok := lines[cur]; !ok {
				lines[cur] = n + 1
			}
			continue
		}
		if m := assignment.FindStringSubmatch(line); m != nil {
			p := strings.Trim(m[1], `"`)
			if cur != "" {
				p = cur + "." + p
			}
			if _, ok := lines[p]; !ok {
				lines[p] = n + 1
			}
		}
	}
	return lines
}

// line returns the line of path, or of the nearest table or list that
// holds it; 0 when none is known.
func (l fieldLines) line(path string) int {
	for path != "" {
		if n, ok := l[path]; ok {
			return n
		}
		if strings.HasSuffix(path, "]") {
			path = path[:strings.LastIndexByte(path, '[')]
			continue
		}
		i := strings.LastIndexByte(path, '.')
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}
