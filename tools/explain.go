package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
)

// argumentRules describe each tool's arguments for explanations: the type
// of each, and which are required.
var argumentRules = map[string]struct {
	types    map[string]string // argument → JSON type
	required []string
}{
	"fetch": {types: map[string]string{"key": "string", "method": "string", "path": "string", "query": "object of strings",
		"headers": "object of strings", "body": "string", "max_wait_s": "number", "max_length": "integer", "start_index": "integer"},
		required: []string{"path"}},
	"quota_status": {types: map[string]string{"key": "string", "offset": "integer", "limit": "integer"}},
}

// explainArguments rewrites the result of a call that mcp-go's schema
// validation refused (an isError result without the code every failure of
// the tools' own carries) into sentences an agent can act on, derived from
// the arguments themselves.
func explainArguments(_ context.Context, _ any, req *mcp.CallToolRequest, result any) {
	res, ok := result.(*mcp.CallToolResult)
	if !ok || res == nil || !res.IsError || res.StructuredContent != nil || failureCode(res) != "" {
		return
	}
	rules, ok := argumentRules[req.Params.Name]
	if !ok {
		return
	}
	var args map[string]json.RawMessage
	raw, _ := json.Marshal(req.Params.Arguments)
	if err := json.Unmarshal(raw, &args); err != nil && string(raw) != "null" {
		*res = *failure("badArguments", fmt.Sprintf("The arguments of %s must be a JSON object.", req.Params.Name))
		return
	}
	var problems []string
	for _, name := range rules.required {
		if _, ok := args[name]; !ok {
			problems = append(problems, fmt.Sprintf("%s is required (%s)", name, article(rules.types[name])))
		}
	}
	names := make([]string, 0, len(args))
	for name := range args {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		want, known := rules.types[name]
		if !known {
			problems = append(problems, fmt.Sprintf("%s is not an argument of %s", name, req.Params.Name))
			continue
		}
		if !hasType(args[name], want) {
			problems = append(problems, fmt.Sprintf("%s must be %s", name, article(want)))
		}
	}
	if len(problems) == 0 { // nothing to add to what the validator said but its code
		res.Meta = failure("badArguments", "").Meta
		return
	}
	valid := make([]string, 0, len(rules.types))
	for name := range rules.types {
		valid = append(valid, name)
	}
	sort.Strings(valid)
	*res = *failure("badArguments", fmt.Sprintf("The arguments of %s are not valid: %s. Its arguments are %s.",
		req.Params.Name, strings.Join(problems, "; "), strings.Join(valid, ", ")))
}

func hasType(raw json.RawMessage, want string) bool {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return false
	}
	switch want {
	case "string":
		_, ok := v.(string)
		return ok
	case "number":
		_, ok := v.(float64)
		return ok
	case "integer":
		f, ok := v.(float64)
		return ok && f == float64(int64(f))
	case "object of strings":
		m, ok := v.(map[string]any)
		for _, x := range m {
			if _, isString := x.(string); !isString {
				return false
			}
		}
		return ok
	}
	return true
}

func article(noun string) string {
	if strings.ContainsRune("aeiou", rune(noun[0])) {
		return "an " + noun
	}
	return "a " + noun
}
