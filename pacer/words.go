package pacer

import (
	"fmt"
	"time"
)

// FormatDuration says d as a person would, never less than it is (the
// unit shown is rounded up): "under a second", "31 s", "119 s", "4 min",
// "1 h", "1 h 5 min". Every duration in advice and in a reason is said
// through it, so that a pause's words and its retry-after in whole
// seconds (rounded up too) agree: FormatDuration of a whole number of
// seconds n is "n s" below 2 min, and less than a minute above n beyond.
// A zero or negative d is "0 s".
func FormatDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0 s"
	case d < time.Second:
		return "under a second"
	}
	s := (d + time.Second - 1) / time.Second
	if s < 120 {
		return fmt.Sprintf("%d s", s)
	}
	m := (s + 59) / 60
	if m < 60 {
		return fmt.Sprintf("%d min", m)
	}
	if m%60 == 0 {
		return fmt.Sprintf("%d h", m/60)
	}
	return fmt.Sprintf("%d h %d min", m/60, m%60)
}

// seconds is FormatDuration, by the name the pacer's sentences use.
func seconds(d time.Duration) string { return FormatDuration(d) }

// pace says calls spread spacing apart: "about one every 4 s", or under
// a second "about 3 a second" (rounded down: never faster than it is).
func pace(spacing time.Duration) string {
	if spacing < time.Second {
		if spacing <= 0 {
			return "as they come"
		}
		if n := int(time.Second / spacing); n > 1 {
			return fmt.Sprintf("about %d a second", n)
		}
		return "about one a second"
	}
	return "about one every " + FormatDuration(spacing)
}

// apart says how far apart calls go: "3 s apart", "less than a second
// apart".
func apart(spacing time.Duration) string {
	if spacing < time.Second {
		return "less than a second apart"
	}
	return FormatDuration(spacing) + " apart"
}

// canMake says that n more calls can be made while a budget's reset
// holds: "You can make 12 more calls in the next 40 s", or "… now" when
// it holds for less than a second (a moment is no time to plan in).
func canMake(n int64, reset time.Duration) string {
	if reset < time.Second {
		return "You can make " + calls(n) + " now"
	}
	return "You can make " + calls(n) + " in the next " + FormatDuration(reset)
}

// forNext says how long something holds: "for the next 18 s", "for
// under a second".
func forNext(d time.Duration) string {
	if d < time.Second {
		return "for " + FormatDuration(d)
	}
	return "for the next " + FormatDuration(d)
}

// spreadWords is the advice of an upstream budget below its low-water
// mark: n calls left for reset, spread spacing apart.
func spreadWords(n int64, reset, spacing time.Duration) string {
	if spacing <= 0 {
		return canMake(n, reset) + "." // no time to spread them over
	}
	return canMake(n, reset) + "; spread them out, " + pace(spacing) + "."
}
