package spelling

import "testing"

func TestClosest(t *testing.T) {
	candidates := []string{"generic", "github", "gitlab", "openai", "ietf"}
	tests := []struct{ name, want string }{
		{"githbu", "github"},
		{"gitlba", "gitlab"},
		{"opnai", "openai"},
		{"ieft", "ietf"},
		{"stripe", ""},
		{"x", ""}, // one letter is no evidence of anything
		{"github", "github"},
	}
	for _, tt := range tests {
		if got := Closest(tt.name, candidates); got != tt.want {
			t.Errorf("Closest(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestDistance(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"a", "", 1}, {"", "abc", 3}, {"listen", "lsiten", 2}, {"kitten", "sitting", 3},
	}
	for _, tt := range tests {
		if got := Distance(tt.a, tt.b); got != tt.want {
			t.Errorf("Distance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}
