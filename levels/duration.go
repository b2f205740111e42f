package levels

import (
	"fmt"
	"math"
	"math/big"
	"time"
)

// units are the duration units of the level-table grammar.
var units = map[string]time.Duration{
	"ms": time.Millisecond,
	"s":  time.Second,
	"m":  time.Minute,
	"h":  time.Hour,
	"d":  24 * time.Hour,
}

const wantUnits = "want ms, s, m, h or d"

// parseDuration parses s (see [ParseDuration]). It returns the reason s is bad, or "". Arithmetic is exact: a value
// that overflows an int64 of nanoseconds, or has a fraction finer than a nanosecond, is an error, never rounded.
func parseDuration(s string) (time.Duration, string) {
	if s == "" {
		return 0, "empty duration"
	}
	neg := false
	if s[0] == '-' || s[0] == '+' {
		neg = s[0] == '-'
		s = s[1:]
	}
	if s == "0" {
		return 0, ""
	}
	if s == "" {
		return 0, "no number after the sign"
	}
	total := new(big.Int)
	for s != "" {
		i := 0
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		whole := s[:i]
		s = s[i:]
		frac := ""
		if s != "" && s[0] == '.' {
			s = s[1:]
			j := 0
			for j < len(s) && isDigit(s[j]) {
				j++
			}
			frac = s[:j]
			s = s[j:]
		}
		if whole == "" && frac == "" {
			return 0, fmt.Sprintf("expected a number at %q", s)
		}
		j := 0
		for j < len(s) && s[j] != '.' && !isDigit(s[j]) {
			j++
		}
		unitText := s[:j]
		s = s[j:]
		if unitText == "" {
			return 0, "missing unit (" + wantUnits + ")"
		}
		unit, ok := units[unitText]
		if !ok {
			return 0, fmt.Sprintf("unknown unit %q (%s)", unitText, wantUnits)
		}
		// value = whole.frac * unit = (whole||frac) * unit / 10^len(frac), exactly.
		num, _ := new(big.Int).SetString(whole+frac+"0", 10) // the "0" keeps ".5" and "5." parseable
		num.Mul(num, big.NewInt(int64(unit)))
		den := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(frac)+1)), nil)
		q, r := num.QuoRem(num, den, new(big.Int))
		if r.Sign() != 0 {
			return 0, "finer than a nanosecond"
		}
		total.Add(total, q)
		if total.Cmp(maxNanos) > 0 {
			return 0, "out of range"
		}
	}
	if neg {
		total.Neg(total)
	}
	if !total.IsInt64() {
		return 0, "out of range"
	}
	return time.Duration(total.Int64()), ""
}

// maxNanos bounds the magnitude of a duration: |math.MinInt64| nanoseconds.
var maxNanos = new(big.Int).Add(big.NewInt(math.MaxInt64), big.NewInt(1))

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
